"""The FLTrust pipeline tests' shared set-up (tests/fl/test_fl_fltrust_job.py, test_fl_fltrust_dp.py):
10 training clients, 30 % of them sign-flipping attackers at −4×, the server's root data and a test set,
all from one ``make_data`` draw (clients 0..9 train; client 10's examples are the root data, 11..14 the
test set, same labelling vector)."""

from __future__ import annotations

import numpy as np

from tests.support.fl_pipeline_support import make_data

N_CLIENTS = 10
ATTACKERS = ("dev-0", "dev-4", "dev-7")  # 30 %
SCALE = np.float32(-4.0)
PER_CLIENT = 24
DATA = make_data(N_CLIENTS + 5, per_client=PER_CLIENT)
ROOT = DATA[N_CLIENTS]
X_TEST = np.concatenate([X for X, _ in DATA[N_CLIENTS + 1 :]])
Y_TEST = np.concatenate([y for _, y in DATA[N_CLIENTS + 1 :]])
