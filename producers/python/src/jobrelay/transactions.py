"""Transactions the producers write into: one small adapter per driver and framework.

A `Transaction` says whether its connection is inside a transaction, which savepoint is the
innermost open one, and executes a statement on that connection. The adapters import nothing
at module level, so this package depends on no framework; `adapt` picks one for an object
(a SQLAlchemy `Session`, `scoped_session` or `Connection`, a psycopg 3 `Connection`, or a
`Transaction` already).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Transaction(Protocol):
    """Where an outbox row is written."""

    def key(self) -> object:
        """The underlying connection or session (two adapters of it compare equal by it)."""

    def in_transaction(self) -> bool:
        """Whether a statement now runs inside a transaction that a commit ends."""

    def savepoint(self) -> object:
        """A token of the innermost open savepoint (equal while the same one is open)."""

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        """Run `sql` with positional `%s` parameters on the connection."""


class DjangoTransaction:
    """Django's connection `using` (`"default"`): inside `transaction.atomic()` (or with
    autocommit off) a row joins the transaction; a rolled-back savepoint takes it back."""

    def __init__(self, using: str = "default") -> None:
        self.using = using

    def _connection(self) -> Any:
        from django.db import connections

        return connections[self.using]

    def key(self) -> object:
        return self._connection()

    def in_transaction(self) -> bool:
        connection = self._connection()
        return bool(connection.in_atomic_block or not connection.get_autocommit())

    def savepoint(self) -> object:
        return tuple(self._connection().savepoint_ids)

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        with self._connection().cursor() as cursor:
            cursor.execute(sql, list(params))


class SqlAlchemySession:
    """A SQLAlchemy 2 `Session`, or a `scoped_session` (Flask-SQLAlchemy's `db.session`: each
    call uses the current scope's session). The row joins the session's transaction, on the
    connection the session uses, and commits with `session.commit()`; `begin_nested()`
    savepoints are respected. A session that autobegins (the default) is always in a
    transaction: a call before any other statement begins it."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def _session(self) -> Any:
        from sqlalchemy.orm import scoped_session

        if isinstance(self.session, scoped_session):
            return self.session()
        return self.session

    def key(self) -> object:
        return self._session()

    def in_transaction(self) -> bool:
        session = self._session()
        return bool(session.in_transaction() or session.autobegin)

    def savepoint(self) -> object:
        return self._session().get_nested_transaction()

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        self._session().connection().exec_driver_sql(sql, tuple(params))


class SqlAlchemyConnection:
    """A SQLAlchemy 2 `Connection`: its transaction (`engine.begin()`, `connection.begin()`, or
    the one it autobegins, ended by `connection.commit()`); with the `AUTOCOMMIT` isolation
    level, only inside `connection.begin()`."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def key(self) -> object:
        return self.connection

    def in_transaction(self) -> bool:
        if self.connection.in_transaction():
            return True
        isolation = self.connection.get_execution_options().get("isolation_level")
        return bool(isolation != "AUTOCOMMIT")

    def savepoint(self) -> object:
        return self.connection.get_nested_transaction()

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        self.connection.exec_driver_sql(sql, tuple(params))


class PsycopgConnection:
    """A psycopg 3 `Connection`. Without autocommit every statement is in a transaction (the
    first one begins it, `commit()` ends it); with autocommit, only inside
    `connection.transaction()`."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def key(self) -> object:
        return self.connection

    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        status = self.connection.info.transaction_status
        return bool(not self.connection.autocommit or status != TransactionStatus.IDLE)

    def savepoint(self) -> object:
        # psycopg counts the open `transaction()` blocks; each nested one is a savepoint.
        return getattr(self.connection, "_num_transactions", 0)

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        self.connection.execute(sql, list(params))


def adapt(obj: Any) -> Transaction:
    """The adapter for a session, connection or transaction object."""
    if isinstance(obj, Transaction):
        return obj
    module = type(obj).__module__
    if module.startswith("sqlalchemy"):
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session, scoped_session

        if isinstance(obj, (Session, scoped_session)):
            return SqlAlchemySession(obj)
        if isinstance(obj, Connection):
            return SqlAlchemyConnection(obj)
    if module.startswith("psycopg"):
        import psycopg

        if isinstance(obj, psycopg.Connection):
            return PsycopgConnection(obj)
    raise TypeError(
        f"jobrelay cannot write through a {type(obj).__module__}.{type(obj).__qualname__}: "
        "give a SQLAlchemy Session, scoped_session or Connection, a psycopg 3 Connection, "
        "or a jobrelay.transactions.Transaction"
    )
