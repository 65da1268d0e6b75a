"""The SQLite store: the only package that talks SQL."""
from storage.errors import Conflict, InvalidInput, NotFound, StorageUnavailable, StoreBusy, StoreError
from storage.comparisons import WINNERS
from storage.ratings import FLAGS
from storage.paths import DataDir
from storage.records import (Agent, Annotator, ArenaPair, Comparison, Conversation, Job, Message, Policy,
                             QueueAssignment, QueueItem, Rating, RewardModel, Withdrawal)
from storage.store import Store

__all__ = ["FLAGS", "WINNERS", "DataDir", "Store", "StoreError", "InvalidInput", "NotFound", "Conflict", "StorageUnavailable", "StoreBusy", "Agent",
           "Annotator", "ArenaPair", "Comparison", "Conversation", "Job", "Message", "Policy", "QueueAssignment",
           "QueueItem", "Rating", "RewardModel", "Withdrawal"]
