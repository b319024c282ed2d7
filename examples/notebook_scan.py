# %% [markdown]
# # A fovea table in a notebook, scanned on Lambda
#
# Plans a scan of `public.pgbench_accounts` at the lake's newest checkpoint,
# runs every split on the `fovea-scan` Lambda function in parallel, and
# plots the account balances. Settings come from the environment:
# `FOVEA_LAKE` (s3://…), `FOVEA_STATE` (dynamodb://…), `FOVEA_FUNCTION`
# (default fovea-scan), `FOVEA_PLOT` (where the PNG goes), and the usual AWS
# variables (`AWS_ENDPOINT_URL_LAMBDA` for `cargo lambda watch`).

# %%
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python"))
import fovea_client  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

# %%
accounts = fovea_client.scan(
    "public.pgbench_accounts",
    lake=os.environ["FOVEA_LAKE"],
    state=os.environ["FOVEA_STATE"],
    function=os.environ.get("FOVEA_FUNCTION", "fovea-scan"),
    columns=["aid", "bid", "abalance"],
)
print(f"{accounts.num_rows} accounts, total balance {pc.sum(accounts['abalance']).as_py()}")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
ax.hist(accounts["abalance"].to_numpy(), bins=40, color="#3b6ea5")
ax.set_title("pgbench account balances (fovea lake, scanned on Lambda)")
ax.set_xlabel("balance")
ax.set_ylabel("accounts")
fig.tight_layout()
out = os.environ.get("FOVEA_PLOT", "balances.png")
fig.savefig(out, dpi=100)
print(f"plot written to {out}")
