"""``python -m tessera.kube up|down|status``: the ``tessera cluster`` commands, runnable
before (or without) the top-level CLI registering them."""

from tessera.kube.cli import cluster

if __name__ == "__main__":
    cluster(prog_name="tessera cluster")
