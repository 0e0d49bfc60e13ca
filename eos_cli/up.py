"""``eos up``: a whole cluster on loopback ports, in the foreground.

One coordinator (or several, on PostgreSQL) and M storage nodes run as child processes,
each with its own data directory under ``--data-dir`` and its log file beside it. The
cluster's internal token is made once and kept in the data directory, so a restart of
``eos up`` finds the same cluster: same data, same token, same ports. With ``--auth`` it
also makes a tokens file and a super user's token there.

Every node is given every coordinator's URL, so a node can still verify transactional
batches while one coordinator is down. Once the cluster is ready, ``eos up`` supervises
it (``eos_cli.supervisor``): a service that dies is reported on stderr and restarted
with a growing delay while the others keep running. Ctrl-C or SIGTERM stops every child
cleanly (SIGTERM, then SIGKILL for any that hangs).

The plan and its services come from ``eos_cli.launcher``, which the tests and the
benchmarks start their clusters with too.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from eos_cli.launcher import ADMIN, ClusterPlan
from eos_cli.supervisor import Supervisor, stop_on_signals

__all__ = ["Cluster", "ClusterPlan", "run_up"]

console = Console(stderr=True)


class Cluster:
    """The plan's services under a supervisor: started together, kept running, stopped
    in reverse order."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.children = plan.build()
        self.supervisor = Supervisor(self.children)

    def start(self, timeout: float = 120.0, stopping: Callable[[], bool] = lambda: False) -> None:
        self.supervisor.start(timeout, stopping)

    def supervise(self, stopping: Callable[[], bool]) -> None:
        self.supervisor.run(stopping)

    def stop(self) -> None:
        self.supervisor.stop()

    @property
    def bootstrap_url(self) -> str:
        """One coordinator: enough for a client that only takes one URL."""
        return self.plan.coordinator_urls[0]


def run_up(plan: ClusterPlan) -> int:
    """Run the cluster until Ctrl-C / SIGTERM; returns the exit code (1 if the first start
    failed; deaths after that are restarted, not fatal)."""
    stopping = stop_on_signals()
    cluster = Cluster(plan)
    try:
        cluster.start(stopping=stopping.is_set)
    except RuntimeError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        cluster.stop()
        return 1
    if not stopping.is_set():
        for child in cluster.children:
            print(f"{child.name:<14} {child.url}", flush=True)
        if plan.auth:
            print(f"auth on: export EOS_TOKEN=$(cat {plan.data_dir / 'admin-token'})  "
                  f"({ADMIN}, a super user; eos auth new-token adds others)", flush=True)
        print(f"pids in {plan.data_dir / 'run'}; a service that dies is restarted", flush=True)
        print(
            f"cluster ready: bootstrap {plan.bootstrap_list}  (data in {plan.data_dir})",
            flush=True,
        )
        cluster.supervise(stopping.is_set)
    cluster.stop()
    print("cluster stopped", flush=True)
    return 0
