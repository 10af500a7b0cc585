"""Prio3 on one machine: the deployment, the stack and ``ldp demo --prio3`` (docs/PRIO3.md)."""
