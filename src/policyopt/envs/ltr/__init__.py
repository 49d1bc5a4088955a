"""Learning-to-rank environments for SRPO: synthetic (`synthetic`), click (`clicks`) and
diversity (`diversity`) collections, the LM reranker task (`rerank`), the LambdaRank and
PG-Rank baselines (`baselines`) and the ranking quickstart's summary (`summary`)."""

from policyopt.envs.ltr import clicks, diversity, rerank, synthetic  # noqa: F401  (register)
