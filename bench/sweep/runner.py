"""Run a sweep cell by cell: one subprocess per cell, a marker per finished cell, never a lost one.

Protocol per cell (in file order, which is dependency order):

1. A marker with the same hash and a final status (``ok``, or ``skip`` not caused by a
   dependency) -> the cell is finished: kept as is, never re-run (unless ``redo`` names it
   or a cell it depends on is re-run in this invocation).
2. Otherwise its folder (a killed run's partial output, a stale config, an error) is
   discarded, except what the cell resumes from (``Cell.resume_state``: an encode's finished
   shards) when its last start (``attempt.json``) had the same ``resume_key`` (argv, the
   dependencies' hashes, the code identity) and ``redo`` does not name it: an interrupted or
   timed-out encode cell continues where it stopped, as ``inrbench encode`` does.
   A dependency that is not ``ok`` -> a ``skip`` marker naming it.
3. Else the cell's ``process_argv`` (``python -m bench <argv>``, forked from a server with torch
   imported, ``bench.sweep.forkserver``; the torchrun line for a cell of ``nproc > 1`` processes)
   runs with the cell folder as working directory, stdout and stderr to ``stdout.log``/``stderr.log``. Status: rows the cell wrote itself decide first
   (``inrbench bench`` writes a skip row for an ``Unavailable`` pipeline, an error row for a
   crash); otherwise exit 0 -> ok, else error with the tail of stderr.
4. The marker is written atomically (temp file + rename) after the subprocess has exited.

A cell the sweep cannot start (``Cell.elsewhere``: ``nnodes > 1``, run by hand on every node) gets
a ``skip`` marker with the reason and the per-node line; the marker says ``elsewhere`` and, like a
skip caused by a dependency, is not final. Its folder is kept: when the hand-started run has
written its rows there (``--out`` of the printed line), the next sweep takes its status from
them, as for any cell, and keeps it (unless the cell's configuration changed).

A cell's identity (``hash``) is its ``config_hash`` (its fields, its argv and its dependencies'
config hashes) plus the code identity (``bench.envinfo.code_identity``: the package code version
and the torch/torchvision/DALI/PIL versions), both recorded in the marker with ``code``. A finished
cell whose config hash matches but whose code identity does not is *stale*: it is recomputed, or
kept as it is with ``keep_stale`` (the report marks it). Changing a cell
(or anything upstream) redoes exactly what it affects, replacing the results it had: a cell folder holds
the results of the cell as the file now describes it (``changed``, said through ``plan`` before any cell
runs). The config hash covers ``Cell.identity``:
a ``bench`` cell's ``nproc``/``nnodes`` when not 1 (the world size changes the measurement), not an
``encode`` cell's (its store does not depend on them), never the rendezvous. Killing the sweep (SIGKILL, SIGINT)
leaves no marker for the running cell; the child gets SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``: torchrun stops its workers on SIGTERM, a plain child just ends), and a cell
past its timeout gets SIGTERM, then SIGKILL after ``KILL_GRACE_S``.
"""

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.atomic import atomic_write_json
from bench.errors import InputError
from bench.outputs import claim
from bench.sweep import forkserver, layout
from bench.sweep.cells import Cell, EncodeCell, Rendezvous
from bench.sweep.spec import ID_RE, SweepConfig

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
FINAL = ("ok", "skip")
KILL_GRACE_S = 30.0  # torchrun waits up to 30 s for its workers after SIGTERM


@dataclass
class SweepContext:
    out: Path
    data_root: Path | None
    cells: dict[str, Cell]
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    fork: bool = False  # start ``python -m bench`` cells from the fork server (``bench.sweep.forkserver``)

    def cell_dir(self, cell_id: str) -> Path:
        # the folder is emptied before the cell runs: an id of "." or ".." would name a parent
        if not ID_RE.match(cell_id):
            raise InputError(f"cell id {cell_id!r} is not a folder name ({ID_RE.pattern})")
        return self.out / layout.CELLS_DIR / cell_id

    def shared_dir(self, name: str) -> Path:
        return self.out / layout.SHARED_DIR / name

    def output(self, cell_id: str) -> Path:
        return self.cells[cell_id].output(self)


@dataclass
class SweepSummary:
    """Counts of this run: ``kept`` finished earlier, ``ran`` executed now; statuses of all cells."""

    kept: list[str] = field(default_factory=list)
    # finished with other settings (fields, command line or a cell upstream): run again, results replaced
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
    """Merkle hash per cell: its fields + argv + its dependencies' hashes; with ``code`` (a code
    identity id, ``bench.envinfo.code_identity()["id"]``) each hash also covers the code."""
    hashes: dict[str, str] = {}
    for c in cfg.cells:
        doc = {"cell": c.identity(), "argv": c.argv(ctx), "deps": [hashes[d] for d in c.deps()]}
        hashes[c.id] = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]
    if code is None:
        return hashes
    return {k: hashlib.sha256(f"{h}:{code}".encode()).hexdigest()[:16] for k, h in hashes.items()}


def resume_keys(cfg: SweepConfig, ctx: SweepContext, hashes: dict[str, str], code: str) -> dict[str, str]:
    """Per cell, what its resumable state depends on: its argv, its dependencies' ``hashes`` and the
    code, not fields that leave its output alone (``timeout_s``: raising it resumes a timed-out cell)."""
    keys = {}
    for c in cfg.cells:
        doc = {"argv": c.argv(ctx), "deps": [hashes[d] for d in c.deps()], "code": code}
        keys[c.id] = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return keys


def code_identity() -> dict[str, Any]:
    """The code identity every cell hash of this run includes (``bench.envinfo.code_identity``)."""
    from bench import envinfo

    return envinfo.code_identity()


def _dataset_of(cell: Cell, cells: dict[str, Cell]) -> str:
    """The prepared dataset a cell works on (the prepare cell's ``name``), or ``""``."""
    if cell.kind == "prepare":
        return cell.name or cell.id  # type: ignore[attr-defined]
    data = getattr(cell, "data", None)
    if data and data in cells:
        return _dataset_of(cells[data], cells)
    return ""


@contextlib.contextmanager
def _lock(out: Path, data_root: Path | None) -> Iterator[None]:
    """Claim ``out`` as a sweep folder (``bench.outputs``) and hold its lock while the sweep runs."""
    with claim(out, "sweep", inputs={"--data-root": data_root}, mode="append"):
        yield


def stderr_tail(path: Path, lines: int = 3, limit: int = 500) -> str:
    """Last non-empty lines of a log (progress-bar carriage returns split lines), on one line."""
    try:
        data = path.read_bytes()[-20000:].decode("utf-8", "replace")
    except OSError:
        return ""
    parts = [p.strip() for p in data.replace("\r", "\n").split("\n") if p.strip()]
    text = " | ".join(parts[-lines:])
    return text[-limit:]


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
    """Status of a cell started by hand (on every node): from the rows its run wrote (``bench``), or
    ok when its output file exists (``encode`` writes its store atomically, at the end); else skip."""
    own = _own_status(cell_dir)
    if own is not None:
        return own
    try:
        rows = layout.cell_rows(cell_dir)
    except InputError:
        rows = None
    done = (rows is not None and not rows.empty) or output.is_file()
    return ("ok", "") if done else ("skip", elsewhere)


FORK_MIN_CELLS = 3


def _forkable(cmd: list[str]) -> bool:
    return cmd[:3] == [sys.executable, "-m", "bench"]


def _run_cell(cell: Cell, cmd: list[str], cell_dir: Path, fork: bool = False) -> tuple[str, str, int | None]:
    """Execute one cell (``cmd``: its ``process_argv``; ``fork``: from the fork server when it can);
    returns (status, reason, returncode)."""
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
    tail = stderr_tail(cell_dir / "stderr.log")
    return "error", f"exit {rc}: {tail}" if tail else f"exit {rc}", rc


def run_sweep(cfg: SweepConfig, out: str | Path, data_root: str | Path | None = None,
              resume: bool = False, progress: bool = True, redo: tuple[str, ...] = (),
              keep_stale: bool = False, plan: Callable[[SweepSummary], None] | None = None) -> SweepSummary:
    """Run every cell not already finished; return what was kept, run and each cell's status.

    A cell finished under another code identity (stale) is run again, or kept with ``keep_stale``.
    A cell finished with other settings (``changed``) is run again, its earlier results replaced.
    plan: called once before the first cell runs, with the summary's ``kept``, ``changed``, ``stale``
    and ``kept_stale`` filled in (what will be replaced, said before it is).

    redo: glob patterns over cell ids to run again even if finished (e.g. after a code change
    made their outputs stale); every cell depending on a re-run cell is re-run too.
    """
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
    with _lock(out, ctx.data_root):
        ident = code_identity()
        config_hashes = cell_hashes(cfg, ctx)
        hashes = cell_hashes(cfg, ctx, ident["id"])
        keys = resume_keys(cfg, ctx, hashes, ident["id"])
        resolved = cfg.to_dict()
        resolved["data_root"] = str(ctx.data_root) if ctx.data_root else None
        resolved["code"] = ident
        for c in resolved["cells"]:
            c["argv"] = cells[c["id"]].argv(ctx)
            c["process_argv"] = cells[c["id"]].process_argv(ctx)
            c["hash"] = hashes[c["id"]]
            c["config_hash"] = config_hashes[c["id"]]
            c["deps"] = list(cells[c["id"]].deps())
        atomic_write_json(out / layout.SWEEP_FILE, resolved)
        _write_env(out)

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
            # same config, other code (a marker from before code identities: its hash is the config hash)
            stale = done and m.get("hash") != hashes[cell.id] and \
                m.get("config_hash", m.get("hash")) == config_hashes[cell.id]
            changed = done and m.get("config_hash", m.get("hash")) != config_hashes[cell.id]
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
            shutil.rmtree(ctx.shared_dir(EncodeCell.FIT_CACHE), ignore_errors=True)
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
                                      resume_key=keys[cell.id], fresh=cell.id in forced)
                status[cell.id] = (st, reason)
                summary.ran.append(cell.id)
                layout.write_merged(out)
                bar.update(1)
        finally:
            bar.close()
            forkserver.close()
        if not todo:
            layout.write_merged(out)
    summary.status = {k: v[0] for k, v in status.items()}
    summary.wall_s = time.perf_counter() - t_start
    return summary


def _write_env(out: Path) -> None:
    from bench import envinfo

    atomic_write_json(out / layout.ENV_FILE, envinfo.collect())


def _clear_cell_dir(cell: Cell, ctx: SweepContext, cell_dir: Path, resume_key: str | None) -> None:
    """Empty the folder of a cell about to run, keeping its ``resume_state`` (and the record of that
    start) when its last start had ``resume_key`` (``None``: keep nothing)."""
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
