"""`policyopt data fetch mslr`: data sets fetched into the user's cache (never committed)."""

from __future__ import annotations

import argparse

DATASETS = ("mslr",)


def add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="fetch a data set into the cache (~/.cache/policyopt/data)")
    p.add_argument("action", choices=["fetch"])
    p.add_argument("dataset", choices=DATASETS, help="mslr: MSLR-WEB subset of rankeval 0.8.2")
    p.set_defaults(func=run_data, overrides=[])


def run_data(args: argparse.Namespace) -> int:
    from policyopt.tasks.mslr_data import fetch_mslr

    train, test = fetch_mslr()
    print(f"MSLR subset: {train}\n             {test}")
    return 0
