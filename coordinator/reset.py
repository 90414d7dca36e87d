"""`prime-coordinator reset`: drop the run's ledger tables and delete its data dir, after saying what goes."""

from __future__ import annotations

import shutil

import typer
from sqlalchemy.exc import DBAPIError

from coordinator.config import CoordinatorConfig
from coordinator.ledger.ownership import drop_ledger, hold_ledger, ledger_tables, shown_url
from coordinator.ledger.storage.engine import Database
from coordinator.serving.server import LEDGER_URL_FIX
from protocol.errors import StartupError
from runtime.data_dir_lock import hold_data_dir


def reset_run(config: CoordinatorConfig, assume_yes: bool) -> None:
    """`prime-coordinator reset`: drop the run's ledger tables and delete its data dir, after saying what goes."""
    data_dir = config.data_dir
    with hold_data_dir(data_dir, "prime-coordinator reset"):  # refused while a coordinator runs on it
        try:
            database = Database(config.ledger_url, config.ledger.sqlite_synchronous, config.ledger.pool_size)
        except Exception as exc:
            raise StartupError(f"cannot open the ledger database {config.ledger_url!r}: {exc}", LEDGER_URL_FIX) from exc
        try:
            with hold_ledger(database):
                tables = ledger_tables(database)
                print(f"ledger {shown_url(database)}: " + (f"{len(tables)} table(s) to drop" if tables else "empty"))
                print(f"data dir {data_dir.resolve()}: to delete")
                if not assume_yes and not typer.confirm("delete the run and start over?", default=False):
                    print("nothing deleted")
                    return
                drop_ledger(database)
        except DBAPIError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
            raise StartupError(f"cannot reset the ledger at {shown_url(database)}: {reason}", LEDGER_URL_FIX) from exc
        finally:
            database.dispose()
        for child in data_dir.iterdir():  # the directory itself holds our lock until we are done
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    print(f"the run is reset: `prime-coordinator start` with the same config begins again at step 0 in {data_dir}")
