"""The two Prio3 aggregators (leader and helper), their HTTP services, the leader's feed from the log and
the collector's combine step (docs/PRIO3.md)."""
