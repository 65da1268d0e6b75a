"""Errors the Store raises; the REST layer maps them to 4xx responses."""


class StoreError(Exception):
    """Base class: a request the Store refused; nothing was written."""

    status = 400


class InvalidInput(StoreError, ValueError):
    """The input is malformed or out of range."""

    status = 422


class NotFound(StoreError, KeyError):
    """An id or name that does not exist."""

    status = 404

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not found"


class Conflict(StoreError):
    """The request clashes with the current state (e.g. a vote on an archived version)."""

    status = 409


class StorageUnavailable(StoreError):
    """The data directory cannot be written (read-only, full, or locked too long)."""

    status = 503


class StoreBusy(StorageUnavailable):
    """Another writer held the database longer than the busy timeout: retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float = 5.0):
        super().__init__(f"the database is busy; retry in {retry_after:.0f} s")
        self.retry_after = retry_after
