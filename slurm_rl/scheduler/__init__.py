"""Scheduling: pure policies over ``SchedState``, the discrete-event simulator, cost models.

Policies know nothing about files; the live coordinator (``coordinator.py``) and the simulator
call the same ``decide(state)`` functions.
"""
