"""Single-method environments, each behind a pip extra and imported by name on first use
(`policyopt.tasks.environments`): `docparse` (DocPO, `[docpo]`), `ads` (DMRL, `[dmrl]`),
`ltr` (learning to rank for SRPO, `[rank]`)."""
