"""``fenchel-cvx certify RUN``: every block of a run's saved iterate re-solved by the oracle and
certified (``run_certificate.certify_run``; the blocks of Sec. 4.5 of the paper), printed as a
table and, with ``--json``, written as JSON (its flags: ``parser._certify_arguments``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .flags import _fail

if TYPE_CHECKING:
    import argparse


def certify(args: argparse.Namespace) -> int:
    """The command: the checks of its flags, then :func:`run_certificate.certify_run`."""
    from ..io import check_destination
    from ..recorded_blocks import FILE
    from ..run_certificate import certify_run, run_data, write_certificate
    from .run_folder import _remove_temporaries

    if not (args.run / "checkpoint.npz").is_file():
        _fail("run", f"{str(args.run)!r} holds no checkpoint.npz of a run")
    if args.json is not None:
        try:
            check_destination("--json", args.json)
        except ValueError as err:
            _fail("--json", str(err).removeprefix("--json "))
    _remove_temporaries("certify", args.run)
    X0 = Y = None
    try:
        if args.recorded:
            if not (args.run / FILE).is_file():
                raise ValueError(f"{str(args.run)!r} holds no {FILE} (train --record-blocks)")
        else:
            X0, Y = run_data(args.run, args.data_dir)
    except ValueError as err:
        _fail("run", str(err))

    def say(name):
        if not args.quiet:
            print(f"certify: {name} ...", flush=True)

    cert = certify_run(
        args.run,
        X0,
        Y,
        blocks=args.blocks,
        workers=args.workers,
        tol=args.tol,
        progress=say,
        recorded=args.recorded,
    )
    print(cert.table())
    if args.json is not None:
        print(f"wrote {write_certificate(args.json, cert)}")
    return 0
