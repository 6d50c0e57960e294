"""Run a sweep cell by cell: one process per cell (forked from ``forkserver`` where it can), a marker written
atomically after each finished cell, the merged view at the end. The protocol: ``docs/sweeps.md``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.atomic import atomic_write_json
from bench.errors import InputError
from bench.outputs import claim
from bench.sweep import forkserver, layout
from bench.sweep.cells import FIT_CACHE, Cell, SweepContext
from bench.sweep.spec import SweepConfig

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
FINAL = ("ok", "skip")
KILL_GRACE_S = 30.0  # torchrun waits up to 30 s for its workers after SIGTERM


@dataclass
class SweepSummary:
    """What a run kept (finished before), ran, found changed (run again) or stale (other code)."""

    kept: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # finished under other code: recomputed now
    kept_stale: list[str] = field(default_factory=list)  # finished under other code: kept (keep_stale)
    ran: list[str] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def errors(self) -> list[str]:
        return [k for k, v in self.status.items() if v == "error"]


def cell_hashes(cfg: SweepConfig, ctx: SweepContext, code: str | None = None) -> dict[str, str]:
    """Merkle hash per cell: ``Cell.identity`` and its dependencies' hashes, and with ``code`` the code identity."""
    hashes: dict[str, str] = {}
    for c in cfg.cells:
        doc = {**c.identity(ctx), "deps": [hashes[d] for d in c.deps()]}
        hashes[c.id] = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]
    if code is None:
        return hashes
    return {k: hashlib.sha256(f"{h}:{code}".encode()).hexdigest()[:16] for k, h in hashes.items()}


def code_identity() -> dict[str, Any]:
    """The code identity every cell hash of this run includes (``bench.envinfo.code_identity``)."""
    from bench import envinfo

    return envinfo.code_identity()


def _dataset_of(cell: Cell, cells: dict[str, Cell]) -> str:
    """The prepared dataset a cell works on (the prepare cell's ``name``), or ``""``."""
    if cell.kind == "prepare":
        return cell.name or cell.id
    data = cell.data
    if isinstance(data, str) and data in cells:
        return _dataset_of(cells[data], cells)
    return ""


def _own_status(cell_dir: Path) -> tuple[str, str] | None:
    """Status from rows the cell wrote itself (``inrbench bench``): a run-level skip/error row wins."""
    try:
        df = layout.cell_rows(cell_dir)
    except InputError:
        return None
    if df is None or df.empty:
        return None
    run = df[df["metric"] == "run"]  # a run was skipped or failed iff it has a "run" row
    for st in ("error", "skip"):
        bad = run[run["status"] == st]
        if len(bad):
            return st, "; ".join(dict.fromkeys(bad["reason"].astype(str)))
    return None


def _hand_run_status(cell_dir: Path, output: Path, elsewhere: str) -> tuple[str, str]:
    """A cell started by hand on every node: its own rows, else ok once its output exists, else skip."""
    own = _own_status(cell_dir)
    if own is not None:
        return own
    with contextlib.suppress(InputError):
        rows = layout.cell_rows(cell_dir)
        if rows is not None and not rows.empty:
            return "ok", ""
    return ("ok", "") if output.is_file() else ("skip", elsewhere)


FORK_MIN_CELLS = 3


def _forkable(cmd: list[str]) -> bool:
    return cmd[:3] == [sys.executable, "-m", "bench"]


def _run_cell(cell: Cell, cmd: list[str], cell_dir: Path, fork: bool = False) -> tuple[str, str, int | None]:
    """Run one cell's ``cmd`` (forked from the server with ``fork``) -> (status, reason, returncode)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    with open(cell_dir / "stdout.log", "wb") as so, open(cell_dir / "stderr.log", "wb") as se:
        server = forkserver.server_for(env) if fork and _forkable(cmd) else None
        proc = server and server.start(cmd[3:], str(cell_dir), so.name, se.name)
        if proc is None:
            proc = subprocess.Popen(cmd, cwd=cell_dir, stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                                    env=env, preexec_fn=forkserver.die_with_parent)
        try:
            rc = proc.wait(timeout=cell.timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()  # torchrun passes it on to its workers (a SIGKILL would orphan them)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return "error", f"timed out after {cell.timeout_s:g} s", None
        except BaseException:  # KeyboardInterrupt: stop the child too, leave no marker
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    own = _own_status(cell_dir)
    if own is not None:
        return own[0], own[1], rc
    if rc == 0:
        return "ok", "", rc
    try:  # the log's last 3 non-empty lines (progress-bar carriage returns split lines), on one line
        data = (cell_dir / "stderr.log").read_bytes()[-20000:].decode("utf-8", "replace")
    except OSError:
        data = ""
    tail = " | ".join([p.strip() for p in data.replace("\r", "\n").split("\n") if p.strip()][-3:])[-500:]
    return "error", f"exit {rc}: {tail}" if tail else f"exit {rc}", rc


def run_sweep(cfg: SweepConfig, out: str | Path, data_root: str | Path | None = None,
              resume: bool = False, progress: bool = True, redo: tuple[str, ...] = (),
              keep_stale: bool = False, plan: Callable[[SweepSummary], None] | None = None) -> SweepSummary:
    """Run every cell not finished (same hash) before; ``redo``: id globs to run again, with what depends on them;
    ``plan``: told what is kept, changed and stale before the first cell runs."""
    import fnmatch

    from bench.cli import progress_bar

    for pat in redo:
        if not any(fnmatch.fnmatchcase(c.id, pat) for c in cfg.cells):
            raise InputError(f"--redo {pat!r} matches no cell of sweep {cfg.name!r}")
    outer = layout.enclosing_sweep(out)
    if outer is not None:
        raise InputError(f"--out {out}: lies inside the results folder of another sweep ({outer}), where it "
                         "would read as a cell that sweep does not declare; choose a --out outside it")
    out = Path(out).resolve()
    if resume and not layout.is_sweep_dir(out):
        raise InputError(f"--resume: nothing to resume (no {layout.SWEEP_FILE})", out)
    cells = cfg.by_id()
    ctx = SweepContext(out=out, data_root=Path(data_root).resolve() if data_root else None, cells=cells,
                       rendezvous=cfg.rendezvous)
    t_start = time.perf_counter()
    summary = SweepSummary()
    with claim(out, "sweep", inputs={"--data-root": ctx.data_root}, mode="append"):
        ident = code_identity()
        config_hashes = cell_hashes(cfg, ctx)
        hashes = cell_hashes(cfg, ctx, ident["id"])
        resolved = cfg.to_dict()
        resolved["data_root"] = str(ctx.data_root) if ctx.data_root else None
        resolved["code"] = ident
        for c in resolved["cells"]:
            cell = cells[c["id"]]
            c.update(argv=cell.argv(ctx), process_argv=cell.process_argv(ctx), hash=hashes[cell.id],
                     config_hash=config_hashes[cell.id], deps=list(cell.deps()))
        atomic_write_json(out / layout.SWEEP_FILE, resolved)
        from bench import envinfo

        atomic_write_json(out / layout.ENV_FILE, envinfo.collect())

        status: dict[str, tuple[str, str]] = {}
        todo: list[Cell] = []
        forced: set[str] = set()
        for cell in cfg.cells:
            m = layout.read_marker(ctx.cell_dir(cell.id))
            redone = any(fnmatch.fnmatchcase(cell.id, p) for p in redo)
            if redone:
                forced.add(cell.id)
            upstream = any(d in {t.id for t in todo} for d in cell.deps())
            done = bool(m) and m["status"] in FINAL and not m.get("blocked_by") and not m.get("elsewhere")
            stale = done and m.get("hash") != hashes[cell.id] and m.get("config_hash") == config_hashes[cell.id]
            changed = done and m.get("config_hash") != config_hashes[cell.id]
            if done and not redone and not upstream and (m.get("hash") == hashes[cell.id] or (stale and keep_stale)):
                status[cell.id] = (m["status"], m.get("reason", ""))
                summary.kept.append(cell.id)
                if stale:
                    summary.kept_stale.append(cell.id)
            else:
                todo.append(cell)
                if stale:
                    summary.stale.append(cell.id)
                elif changed:
                    summary.changed.append(cell.id)
        redone_fits = [c for c in todo if c.kind == "encode"
                       and (c.id in summary.stale or any(fnmatch.fnmatchcase(c.id, p) for p in redo))]
        if redone_fits:  # redone fits must not come back from the cache of the stale ones
            shutil.rmtree(ctx.shared_dir(FIT_CACHE), ignore_errors=True)
        if plan is not None:
            plan(summary)
        # the server pays one interpreter's imports up front: worth it from a few cells on
        ctx.fork = sum(_forkable(c.process_argv(ctx)) for c in todo) >= FORK_MIN_CELLS
        bar = progress_bar(len(cfg.cells), cfg.name, "cell", enabled=progress, initial=len(summary.kept),
                           dynamic_ncols=True)
        try:
            for cell in todo:
                bar.set_postfix_str(cell.id, refresh=True)
                st, reason = _do_cell(cell, ctx, hashes[cell.id], status, cells, bar.write,
                                      identity={"config_hash": config_hashes[cell.id], "code": ident},
                                      resume_key=hashes[cell.id], fresh=cell.id in forced)
                status[cell.id] = (st, reason)
                summary.ran.append(cell.id)
                bar.update(1)
        except BaseException:  # an interrupt or a failure: the cells finished so far still reach the merged view
            with contextlib.suppress(Exception):
                layout.write_merged(out)
            raise
        finally:
            bar.close()
            forkserver.close()
        layout.write_merged(out)  # once per run, not after every cell
    summary.status = {k: v[0] for k, v in status.items()}
    summary.wall_s = time.perf_counter() - t_start
    return summary


def _clear_cell_dir(cell: Cell, ctx: SweepContext, cell_dir: Path, resume_key: str | None) -> None:
    """Empty a cell's folder, keeping its ``resume_state`` when its last start had ``resume_key``."""
    if not cell_dir.is_dir() or cell_dir.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            cell_dir.unlink()
        return
    try:
        last = json.loads((cell_dir / layout.ATTEMPT).read_text())
    except (OSError, ValueError):
        last = None
    same = resume_key is not None and isinstance(last, dict) and last.get("resume_key") == resume_key
    keep = {layout.ATTEMPT, *(p.name for p in cell.resume_state(ctx) if p.parent == cell_dir)} if same else set()
    for c in cell_dir.iterdir():
        if c.name in keep:
            continue
        if c.is_dir() and not c.is_symlink():
            shutil.rmtree(c)
        else:
            c.unlink()


def _do_cell(cell: Cell, ctx: SweepContext, h: str, status: dict[str, tuple[str, str]], cells: dict[str, Cell],
             write, identity: dict[str, Any] | None = None, resume_key: str | None = None,
             fresh: bool = False) -> tuple[str, str]:
    """Run one cell (or record why it cannot run) and write its marker; ``fresh``: resume nothing."""
    cell_dir = ctx.cell_dir(cell.id)
    elsewhere = cell.elsewhere(ctx)
    old = layout.read_marker(cell_dir) if elsewhere else None
    # a cell started by hand writes into its folder: kept unless it holds another configuration's run
    if cell_dir.exists() and not (elsewhere and (old is None or old.get("hash") == h)):
        _clear_cell_dir(cell, ctx, cell_dir, None if fresh else resume_key)
    cell_dir.mkdir(parents=True, exist_ok=True)
    argv = cell.argv(ctx)
    marker: dict[str, Any] = {
        "id": cell.id, "kind": cell.kind, "hash": h, "argv": argv, "process_argv": cell.process_argv(ctx),
        **cell.labels(), "dataset": _dataset_of(cell, cells) or cell.labels()["dataset"], **(identity or {}),
    }
    blocked = [(d, status[d]) for d in cell.deps() if status.get(d, ("error", ""))[0] != "ok"]
    t0 = time.perf_counter()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if blocked:
        d, (dst, dreason) = blocked[0]
        st, reason, rc = "skip", f"dependency {d} {dst}: {dreason}".rstrip(": "), None
        marker["blocked_by"] = [b[0] for b in blocked]
    elif elsewhere:
        st, reason, rc = (*_hand_run_status(cell_dir, cell.output(ctx), elsewhere), None)
        if st == "skip" and reason == elsewhere:
            marker["elsewhere"] = True
    else:
        atomic_write_json(cell_dir / layout.ATTEMPT, {"resume_key": resume_key, "started_utc": started})
        st, reason, rc = _run_cell(cell, cell.process_argv(ctx), cell_dir, ctx.fork)
    wall = time.perf_counter() - t0
    marker.update({"status": st, "reason": reason, "returncode": rc, "wall_s": wall,
                   "started_utc": started})
    atomic_write_json(cell_dir / layout.MARKER, marker)
    write(f"{st:5s} {cell.id} ({wall:.1f} s){': ' + reason if reason else ''}")
    return st, reason
