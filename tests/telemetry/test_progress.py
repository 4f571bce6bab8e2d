"""progress.csv across a resume (no MPI): the lines a killed run wrote after its
checkpoint are dropped, a torn last line too, and the header is always there."""

from __future__ import annotations

from mpirl.telemetry.progress import COLUMNS, Progress, read_progress


def report(progress: Progress, update: int, env_steps: int) -> None:
    progress.report(update=update, env_steps=env_steps, episodes=1, return_sum=1.0,
                    comm_share=0.0)


def test_a_resumed_run_keeps_the_lines_its_checkpoint_counted(tmp_path):
    first = Progress(tmp_path, enabled=True)
    for update in (1, 2):
        report(first, update, 100)     # env steps flat: async pushes that reuse a rollout
    saved = first.state()
    report(first, 3, 100)              # after the checkpoint: the killed run's
    first.close()
    with open(tmp_path / "progress.csv", "a") as f:
        f.write("4,1")                 # a line torn by the kill
    resumed = Progress(tmp_path, enabled=True, resume=True)
    resumed.load_state(saved)
    assert resumed.lines == saved["progress_lines"] == 2
    report(resumed, 3, 100)
    resumed.close()
    assert read_progress(tmp_path)["update"].tolist() == [1, 2, 3]
    assert (tmp_path / "progress.csv").read_text().splitlines()[0] == ",".join(COLUMNS)


def test_a_checkpoint_from_before_lines_were_counted_cuts_by_env_steps(tmp_path):
    first = Progress(tmp_path, enabled=True)
    for update, steps in ((1, 100), (2, 200), (3, 300)):
        report(first, update, steps)
    first.close()
    resumed = Progress(tmp_path, enabled=True, resume=True)
    resumed.load_state({"wall_s": 1.0, "env_steps": 200})
    resumed.close()
    assert read_progress(tmp_path)["env_steps"].tolist() == [100, 200]
    other = Progress(tmp_path, enabled=False, resume=True)     # not the reporting rank
    other.load_state({"wall_s": 1.0, "progress_lines": 0})
    assert read_progress(tmp_path)["env_steps"].tolist() == [100, 200]
