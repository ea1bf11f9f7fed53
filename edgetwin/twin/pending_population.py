"""The population model fitted beside the ensemble members, not before them.

`Twin.fit` on a process pool used to fit the population model (GAN-SMMSG: 3,000 generator steps,
whatever the log's size) in the main process first, with the other core idle, and only then start
the members; but a MAIL-MMSG member needs the population only once its GAIL rounds start, after
behaviour cloning. So on a pool the population is fitted in a thread of the main process while the
workers fit the members (`PopulationInBackground`), and the members get a sampler that loads the
model from the directory the thread saves it to the first time they draw from it, waiting for it
if it is not there yet (`PendingPopulationSampler`). A saved population samples exactly as the fitted
one (`edgetwin.generative.load_population`), so the twin is the one fitted serially.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: files the background fit leaves in its directory: the model, then one of the two markers
MODEL_DIR, READY, FAILED = "model", "READY", "FAILED"


class PendingPopulationSampler:
    """``(n, scenario, seed) -> raw profiles (n, P)`` (as `edgetwin.twin.twin.PopulationSampler`)
    from a population model that a `PopulationInBackground` will save in ``directory``.

    Pickled to the pool's workers before the model exists; a worker loads the model on its first
    draw, waiting (polling every ``poll`` seconds) until the model is saved.

    Raises (on a draw):
        RuntimeError: the background fit failed (its message is in the directory).
    """

    def __init__(self, directory: str | Path, profile: list[str], poll: float = 0.5) -> None:
        self.directory = str(directory)
        self.profile = list(profile)
        self.poll = float(poll)
        self._population: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_population": None}  # the model is loaded where it is drawn from

    def population(self) -> Any:
        """The model, loaded from the directory once it is there."""
        if self._population is None:
            from edgetwin.generative import load_population

            d = Path(self.directory)
            while not (d / READY).is_file():
                if (d / FAILED).is_file():
                    raise RuntimeError(f"the population model's fit failed: {(d / FAILED).read_text()}")
                time.sleep(self.poll)
            import torch

            # loading builds the model's modules, whose initialisation draws from torch's global
            # generator: the member drawing here must go on with the numbers it would have had
            with torch.random.fork_rng(devices=[]):
                self._population = load_population(d / MODEL_DIR)
        return self._population

    def __call__(self, n: int, scenario: str, seed: int) -> np.ndarray:
        out: np.ndarray = self.population().sample(n, scenario=scenario, seed=seed)[self.profile].to_numpy(np.float64)
        return out


class PopulationInBackground:
    """Run ``fit() -> population model`` in a thread while the block runs, saving the model into a
    temporary directory for `sampler`; the directory is removed when the block ends.

    Use::

        with PopulationInBackground(fit, profile_columns) as bg:
            ...members drawing from bg.sampler()...
        population = bg.population()

    Why a thread: the fit is torch's kernels and a Python loop while the main process only waits
    for the pool; a process would need the log pickled once more. When the fit fails, its error is
    raised when the block ends (in place of the members' own error about it) and by `population`.
    """

    def __init__(self, fit: Callable[[], Any], profile: list[str]) -> None:
        self._fit = fit
        self.profile = list(profile)
        self.directory = Path(tempfile.mkdtemp(prefix="edgetwin-population-"))
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="population-fit", daemon=True)

    def _run(self) -> None:
        try:
            model = self._fit()
            model.save(self.directory / MODEL_DIR)
            self._result = model
            (self.directory / READY).touch()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, and to the workers as a file
            self._error = e
            (self.directory / FAILED).write_text(f"{type(e).__name__}: {e}")

    def __enter__(self) -> PopulationInBackground:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join()
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._error is not None:
            raise self._error

    def sampler(self) -> PendingPopulationSampler:
        return PendingPopulationSampler(self.directory, self.profile)

    def population(self) -> Any:
        """The fitted model (after the block)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result
