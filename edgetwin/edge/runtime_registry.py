"""Registry following for the edge runtime: poll, verify, load, warm up, swap, cache, fail-static.

See `edgetwin.edge.runtime` for the behaviour (scopes, hot swap, fail-static start from the cache,
the registry's compare-and-swap rollback).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.bus import Received
from edgetwin.edge.kpi_watch import KPIWatch, lookup_kpi
from edgetwin.edge.registry import (
    CASConflict,
    NoRollbackTarget,
    PointerChange,
    VersionNotFound,
)
from edgetwin.edge.runtime_core import (
    _CACHE_FORMAT,
    RuntimeCore,
    ServedPolicy,
    _atomic_write,
    _Incompatible,
    _key,
    _probe_obs,
)
from edgetwin.edge.signing import ArtifactRejected, Manifest, unpack_artifact, verify_artifact

log = logging.getLogger("edgetwin.runtime")


class RegistryFollower(RuntimeCore):
    """Following the registry: poll, verify, load, warm up and swap; fail-static on outages."""

    def _registry_down(self, e: BaseException) -> None:
        self.stats.registry_errors += 1
        if self.registry_reachable is not False:
            a = self._active
            serving = f"keep serving {a.version} (fail-static)" if a else "no policy loaded yet"
            log.warning("%s: registry unreachable (%s: %s); %s", self.site, type(e).__name__, e, serving)
            self._event(
                "registry_unreachable",
                a.version if a else None,
                a.scope if a else None,
                f"{type(e).__name__}: {e}",
            )
        self.registry_reachable = False

    def _registry_up(self) -> None:
        if self.registry_reachable is False:
            log.info("%s: registry reachable again", self.site)
            self._event("registry_reachable", self.version, None, "")
        self.registry_reachable = True

    async def _resolve(self) -> tuple[str, PointerChange] | None:
        """The first scope (site, cluster, global) with a pointer, and its latest change."""
        for scope in self.scopes:
            history = await self._call(self._areg.history(scope))
            if history:
                return scope, history[-1]
        return None

    async def refresh(self) -> bool:
        """Read the registry now and swap if the current version changed; True if it swapped.

        Raises:
            RegistryError, OSError, ...: the registry could not be read (the caller logs it and
                keeps serving; `start` and the poll loop do).
        """
        assert self._refresh_lock is not None, "start() the runtime first"
        async with self._refresh_lock:
            self.stats.polls += 1
            found = await self._resolve()
            self._registry_up()
            if self._pending_rollback is not None:
                await self._complete_rollback(found)
                found = await self._resolve()
            if found is None:  # nothing promoted anywhere: keep whatever we serve
                if self._active is not None:
                    self._registry_lost(f"no pointer for scopes {', '.join(self.scopes)}")
                return False
            scope, change = found
            version, revision = change.version, change.revision
            # The registry's record of the version (its signed digest) decides what "the same
            # version" means: a name alone may have been reused by a rebuilt registry.
            try:
                record = await self._call(self._areg.manifest(version))
            except VersionNotFound:
                self._registry_lost(f"{scope} points to {version!r}, which the registry no longer holds")
                return False
            self._registry_empty = False
            sha = record.sha256
            if self._vetoed is not None and self._vetoed == (scope, version, revision, sha):
                return False  # the version we rolled back from, still current: do not serve it again
            a = self._active
            if a is not None and a.version == version and a.manifest.sha256 == sha:
                if (a.scope, a.revision) != (scope, revision):
                    a.scope, a.revision = scope, revision
                return False
            if version in self._refused and self._refused_digest.get(version) in (sha, None):
                return False
            served = self._loaded.get(_key(version, sha))
            if served is None:
                served = await self._fetch_and_load(scope, version, revision)
                if served is None:
                    return False
                if a is not None and a.version == version:
                    log.warning(
                        "%s: the registry's %s is other bytes than the %s served (sha256 %s... -> %s...); "
                        "switching to the registry's record",
                        self.site, version, version, a.manifest.sha256[:12], served.manifest.sha256[:12],
                    )  # fmt: skip
            else:
                served.scope, served.revision = scope, revision
            self._activate(served, change.kind, f"{scope} r{revision} ({change.kind})")
            return True

    def _registry_lost(self, why: str) -> None:
        """The registry answers but has no record for us: keep serving, and say so once."""
        if self._registry_empty:
            return
        self._registry_empty = True
        a = self._active
        serving = f"keep serving {a.version} (sha256 {a.manifest.sha256[:12]}..., fail-static)" if a else (
            "nothing to serve yet (fail-static)"
        )
        log.warning("%s: the registry lost its record (%s); %s", self.site, why, serving)
        self._event("registry_lost", a.version if a else None, a.scope if a else None, why)

    async def _fetch_and_load(self, scope: str, version: str, revision: int) -> ServedPolicy | None:
        try:
            packed, manifest = await self._call(self._areg._load(version))
        except VersionNotFound as e:  # gone between the record and the bytes: not "registry down"
            self._registry_lost(f"{scope} points to {version!r}, which the registry no longer holds ({e})")
            return None
        try:
            return await asyncio.to_thread(self._prepare, version, scope, revision, packed, manifest)
        except (ArtifactRejected, _Incompatible) as e:
            reason = e.reason.value if isinstance(e, ArtifactRejected) else "incompatible"
            self._refuse(version, scope, f"{reason}: {getattr(e, 'detail', e)}", manifest.sha256)
            return None

    def _refuse(self, version: str, scope: str | None, reason: str, sha256: str | None = None) -> None:
        self._refused[version] = reason
        self._refused_digest[version] = sha256
        self.stats.refused += 1
        a = self._active
        keep = f"keeping {a.version}" if a else "nothing to serve yet"
        log.warning("%s: refused policy %s from %s: %s; %s", self.site, version, scope, reason, keep)
        self._event("refused", version, scope, reason)

    def _prepare(
        self, version: str, scope: str, revision: int, packed: bytes, manifest: Manifest
    ) -> ServedPolicy:
        """Verify, unpack, load, check and warm up one version (in a worker thread)."""
        verify_artifact(packed, manifest, self.trust, expected_version=version)
        vdir = self.cache_dir / "versions" / version  # the last verified bytes of that name
        policy_dir = vdir / "policy"
        if policy_dir.exists():
            shutil.rmtree(policy_dir)
        vdir.mkdir(parents=True, exist_ok=True)
        tmp = vdir / f".policy.{uuid.uuid4().hex}.partial"
        try:
            unpack_artifact(packed, tmp)
            os.rename(tmp, policy_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        try:
            policy = self.loader(policy_dir)
        except InputError as e:
            raise _Incompatible(f"the artifact is not a loadable policy: {e}") from None
        served = self._build(version, scope, revision, policy, manifest, policy_dir)
        # Keep the verified bytes: a restart with the registry down starts from them (re-verified).
        _atomic_write(vdir / "artifact.tar.gz", packed)
        _atomic_write(vdir / "manifest.json", manifest.to_json())
        return served

    def _build(
        self, version: str, scope: str, revision: int, policy: Any, manifest: Manifest, path: Path
    ) -> ServedPolicy:
        pspec: TwinSpec | None = getattr(policy, "spec", None)
        obs_cols = list(pspec.observation_columns) if pspec is not None else None
        act_cols = list(pspec.action_columns) if pspec is not None else None
        want_obs: list[str] | None
        want_act: list[str] | None
        if self.spec is not None:
            want_obs, want_act = list(self.spec.observation_columns), list(self.spec.action_columns)
        elif self._active is not None:
            want_obs, want_act = self._active.observation_columns, self._active.action_columns
        else:
            want_obs, want_act = obs_cols, act_cols
        if want_obs is None or want_act is None:
            raise _Incompatible(
                "the policy has no spec and the runtime was given none: cannot tell its columns"
            )
        if obs_cols is not None and (obs_cols != want_obs or act_cols != want_act):
            raise _Incompatible(
                f"acts on observation columns {obs_cols} -> actions {act_cols}, but this site serves "
                f"{want_obs} -> {want_act}"
            )
        shield = self.shield
        if shield is not None and not hasattr(shield, "project"):  # a ShieldConfig: build it for this spec
            from edgetwin.policies.shield import Shield

            try:
                shield = Shield(pspec or self.spec, shield)  # type: ignore[arg-type]
            except InputError as e:
                raise _Incompatible(f"the site's shield does not fit this policy's spec: {e}") from None
        served = ServedPolicy(version, scope, revision, policy, shield, manifest, want_obs, want_act, path)
        # Warm-up off the request path: first calls of torch models are slow, and a policy that
        # cannot act must not be swapped in. Mid-range observations are inside any bounds (the
        # site's spec when the policy carries none: zeros are outside e.g. a latency SLO's bounds).
        probe = _probe_obs(pspec or self.spec, len(want_obs))
        try:
            served.act(probe)
        except Exception as e:
            raise _Incompatible(f"the policy failed its warm-up call: {type(e).__name__}: {e}") from None
        if served.shield is not None and hasattr(served.shield, "reset"):
            served.shield.reset()
        if hasattr(policy, "reset"):
            policy.reset()
        return served

    def _activate(self, served: ServedPolicy, kind: str, why: str) -> None:
        """Swap the served reference (one assignment) and restart the KPI watch."""
        with self._state_lock:
            old = self._active
            if old is served:
                return
            baseline_prev = self.watch.window_means() if self.watch is not None and old is not None else {}
            if (
                self.guard is not None and self.guard.margins is None
            ):  # "auto": the first policy's reward KPIs
                self.guard = self.guard.resolve(getattr(served.policy, "spec", None) or self.spec)
                self.watch = KPIWatch(self.guard)
            self._active = served  # the swap: requests that already read `old` finish on it
            self._current_changed(served.version)  # a canary whose control arm this no longer is ends
            # The local rollback target is the version this one replaced; after a rollback it is
            # unknown here (the registry's history knows it), never the version rolled back from.
            self._previous = None if kind == "rollback" else (old or self._previous)
            self._loaded[_key(served.version, served.manifest.sha256)] = served
            if self.freeze_gc:
                gc.freeze()  # the policy just loaded, and everything before it, is long-lived
            keep = {_key(x.version, x.manifest.sha256) for x in (served, self._previous) if x is not None}
            for v in [v for v in self._loaded if v not in keep]:
                del self._loaded[v]
            self.stats.swaps += 1 if old is not None else 0
            if self.watch is not None:
                baseline, source = self._choose_baseline(served, kind, baseline_prev)
                self.watch.start(served.version, baseline, source, judge=kind != "rollback")
            _atomic_write(self.cache_dir / "last_good.json", json.dumps(
                {"format": _CACHE_FORMAT, "version": served.version, "scope": served.scope, "site": self.site,
                 "sha256": served.manifest.sha256}
            ).encode())  # fmt: skip
        log.info(
            "%s: serving %s (from %s; sha256 %s..., key %s)%s",
            self.site, served.version, why, served.manifest.sha256[:12], served.manifest.key_id,
            f", replacing {old.version}" if old is not None else "",
        )  # fmt: skip
        self._event("loaded", served.version, served.scope, why)

    def _choose_baseline(
        self, served: ServedPolicy, kind: str, prev_window: Mapping[str, float]
    ) -> tuple[dict[str, float] | None, str]:
        assert self.guard is not None and self.guard.margins is not None
        key = _key(served.version, served.manifest.sha256)
        if kind == "rollback" and key in self._baselines:
            return self._baselines[key]  # a reinstated version keeps its own baseline
        names = [m.kpi for m in self.guard.margins]
        metrics = served.manifest.metadata.get("metrics") or {}
        from_md = {k: v for k in names if (v := lookup_kpi(metrics, k)) is not None}
        choice: tuple[dict[str, float] | None, str]
        mode = self.guard.baseline
        if (
            mode in ("auto", "previous")
            and prev_window
            and len(prev_window) == len(names)
            and kind != "rollback"
        ):
            choice = (dict(prev_window), f"previous version's last window ({self._active_prev_name()})")
        elif mode in ("auto", "metadata") and from_md and (mode == "metadata" or len(from_md) == len(names)):
            choice = (from_md, "metrics at promotion")
        else:
            choice = (None, "first_window")
        self._baselines[key] = choice
        return choice

    def _active_prev_name(self) -> str:
        return self._previous.version if self._previous else "?"

    def _start_from_cache(self) -> None:
        """Fail-static start: serve the last good version from the cache, verified again."""
        marker = self.cache_dir / "last_good.json"
        if not marker.is_file():
            log.warning(
                "%s: no policy from the registry and no cached last good policy in %s",
                self.site,
                self.cache_dir,
            )
            return
        try:
            doc = json.loads(marker.read_text())
            version, scope = str(doc["version"]), str(doc["scope"])
            vdir = self.cache_dir / "versions" / version
            packed = (vdir / "artifact.tar.gz").read_bytes()
            manifest = Manifest.from_json((vdir / "manifest.json").read_bytes(), version)
            if doc.get("sha256", manifest.sha256) != manifest.sha256:  # other bytes cached under the name
                raise ValueError(f"the cached {version} is not the last good one (sha256 differs)")
        except (OSError, ValueError, KeyError, ArtifactRejected) as e:
            log.warning("%s: the cached last good policy is unreadable (%s)", self.site, e)
            return
        try:
            served = self._prepare(version, scope, 0, packed, manifest)
        except (ArtifactRejected, _Incompatible) as e:
            self._refuse(version, scope, f"cached copy: {e}")
            return
        self._activate(served, "cache", f"local cache {self.cache_dir} (registry unreachable)")
        self._event("cache_start", version, scope, str(self.cache_dir))

    async def _on_policy_note(self, rcv: Received) -> None:
        # A hint only: the registry pointer decides what is served.
        if self._wake is not None:
            self._wake.set()


    async def _registry_rollback(self, scope: str, bad: str, reason: str) -> tuple[str, str]:
        """``registry.rollback(scope, expected=bad)``; returns (outcome, target)."""
        try:
            target = await self._call(
                self._areg.rollback(scope, expected=bad, reason=f"edge runtime {self.site}: {reason}")
            )
        except CASConflict as e:
            log.warning("%s: %s was already moved (%s); following the registry", self.site, scope, e)
            outcome, target = "conflict", str(e.actual)
        except NoRollbackTarget as e:
            log.error("%s: cannot roll back %s in the registry: %s", self.site, scope, e)
            outcome, target = "no_target", bad
        except Exception as e:
            self._registry_down(e)
            return "pending", self._previous.version if self._previous else bad
        else:
            outcome = "rolled_back"
            log.warning("%s: registry %s rolled back from %s to %s", self.site, scope, bad, target)
        self._pending_rollback = None
        self._rollback_outcomes[bad] = (outcome, target)
        return outcome, target

    async def _complete_rollback(self, found: tuple[str, PointerChange] | None) -> None:
        """A rollback the registry missed while unreachable: do it now if the pointer is still the bad one."""
        assert self._pending_rollback is not None
        scope, bad, reason = self._pending_rollback
        if found is None or found[0] != scope or found[1].version != bad:
            self._pending_rollback = None  # someone else moved the pointer meanwhile
            return
        await self._registry_rollback(scope, bad, reason)
