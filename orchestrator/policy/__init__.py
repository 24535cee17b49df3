"""The round's policies, each in one home; every function is pure: the round reads the ledger,
asks, and does what it is told.

- ``boots``: what is booted next for an experiment and when it is decided (``next_action``),
  a configuration failure's count (``config_failure``, ``counted_failures``), a champion that
  stopped booting (``champion_failure``);
- ``schedule``: the champion's re-measurements and the drift sentinel (``remeasure_due``,
  ``suspected_drift``, ``drift_confirmed``, ``keep_boots_inflated``);
- ``looks``: further looks at a decided change (``second_look``, ``last_look``,
  ``overshot``);
- ``infrastructure``: the infrastructure's failures, never a verdict (``infrastructure_retry``,
  ``clocks_off_stop``, ``LEDGER_WAITS``).

Their names are this package's too (``policy.next_action``).
"""

from orchestrator.policy.boots import (
    CHAMPION_BOOTS_PER_BOOT,
    CHAMPION_CHECK,
    REPRODUCED,
    SLOW_CLOCK_NOTE,
    Action,
    BootCandidate,
    BootChampion,
    BootFailure,
    Crash,
    Decide,
    Progress,
    champion_failure,
    config_failure,
    counted_failures,
    crash,
    next_action,
)
from orchestrator.policy.infrastructure import (
    CLOCKS_OFF_ANY_IN_A_ROW,
    CLOCKS_OFF_IN_A_ROW,
    INFRA_BACKOFF_MAX_S,
    LEDGER_WAITS,
    clocks_off_stop,
    infrastructure_retry,
)
from orchestrator.policy.looks import (
    FAIR_TRIAL,
    OUT_OF_BOOTS,
    last_look,
    look_promise,
    overshot,
    second_look,
)
from orchestrator.policy.schedule import (
    CHAMPION_CLOCK_TRIES,
    CONFIRM_SIGMAS,
    DRIFT_SIGMAS,
    Shift,
    drift,
    drift_confirmed,
    keep_boots_inflated,
    keep_test_due,
    remeasure_due,
    shift,
    suspected_drift,
    tests_keep_boots,
)

__all__ = [
    "CHAMPION_BOOTS_PER_BOOT",
    "CHAMPION_CHECK",
    "CHAMPION_CLOCK_TRIES",
    "CLOCKS_OFF_ANY_IN_A_ROW",
    "CLOCKS_OFF_IN_A_ROW",
    "CONFIRM_SIGMAS",
    "DRIFT_SIGMAS",
    "FAIR_TRIAL",
    "INFRA_BACKOFF_MAX_S",
    "LEDGER_WAITS",
    "OUT_OF_BOOTS",
    "REPRODUCED",
    "SLOW_CLOCK_NOTE",
    "Action",
    "BootCandidate",
    "BootChampion",
    "BootFailure",
    "Crash",
    "Decide",
    "Progress",
    "Shift",
    "champion_failure",
    "clocks_off_stop",
    "config_failure",
    "counted_failures",
    "crash",
    "drift",
    "drift_confirmed",
    "infrastructure_retry",
    "keep_boots_inflated",
    "keep_test_due",
    "last_look",
    "look_promise",
    "next_action",
    "overshot",
    "remeasure_due",
    "second_look",
    "shift",
    "suspected_drift",
    "tests_keep_boots",
]
