"""The vote queue: pairs of replies for annotators to vote on, picked where the reward model is least sure.

An app thread, not a job: ``refill.QueueRefill`` keeps each agent's queue stocked while chat is idle (it asks the
serving layer whether it is idle, never the engine) and scores open items with the reward head; ``pool`` says
which contexts it asks about and which two versions answer; ``choice`` (pure functions) picks the next item.
The Store keeps the items and hands them out.
"""
