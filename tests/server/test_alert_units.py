"""Pure pieces of alerting: lifecycle, detectors, signatures, SSRF guard, formats."""

from __future__ import annotations

import asyncio
import ipaddress
import math
import random

import pytest

from server.alerts.detectors import Climb, NonFinite, Threshold
from server.alerts.lifecycle import Lifecycle, Phase, Transition
from server.alerts.rules import DEFAULT_RULES, build_detector
from server.webhooks import formats, signing
from server.webhooks.delivery import RetryPolicy, parse_retry_after
from server.webhooks.netguard import ForbiddenTarget, address_allowed, checked_address


def _run(
    lifecycle: Lifecycle, pattern: str, *, for_steps: int, keep: int
) -> list[tuple[int, Transition]]:
    out = []
    for step, char in enumerate(pattern):
        for transition in lifecycle.step(
            char == "1", step, for_steps=for_steps, keep_firing_for=keep
        ):
            out.append((step, transition))
    return out


def test_lifecycle_pending_firing_resolved_with_for_and_hysteresis() -> None:
    lc = Lifecycle()
    events = _run(lc, "0110111100010001", for_steps=3, keep=3)
    assert events == [
        (1, Transition.PENDING),
        (3, Transition.CANCELLED),  # held 2 < 3 steps: never fired
        (4, Transition.PENDING),
        (6, Transition.FIRING),  # fires on the 3rd consecutive true step
        (10, Transition.RESOLVED),  # after 3 consecutive clear steps (8, 9, 10)
        (11, Transition.PENDING),
        (12, Transition.CANCELLED),
        (15, Transition.PENDING),
    ]
    assert lc.phase is Phase.PENDING and lc.started_step == 15


def test_lifecycle_fires_at_once_with_for_zero_and_round_trips_json() -> None:
    lc = Lifecycle()
    assert lc.step(True, 7, for_steps=0, keep_firing_for=2) == [
        Transition.PENDING,
        Transition.FIRING,
    ]
    assert lc.started_step == 7
    restored = Lifecycle.from_json(lc.to_json())
    assert restored == lc
    assert restored.step(False, 8, for_steps=0, keep_firing_for=2) == []
    assert restored.step(True, 9, for_steps=0, keep_firing_for=2) == []  # clear count resets
    assert restored.step(False, 10, for_steps=0, keep_firing_for=2) == []
    assert restored.step(False, 11, for_steps=0, keep_firing_for=2) == [Transition.RESOLVED]


def test_non_finite_detector_watches_glob_list() -> None:
    det = NonFinite("reward/mean,loss/*")
    state = det.initial_state()
    assert det.update(state, 0, {"other": math.nan}) is None
    assert det.update(state, 1, {"reward/mean": 0.5, "loss/pg": 1.0}).active is False
    signal = det.update(state, 2, {"reward/mean": 0.5, "loss/pg": math.inf})
    assert signal.active and signal.value == math.inf and "loss/pg=inf" in signal.message
    assert det.update(state, 3, {"reward/mean": math.nan}).active


def test_threshold_detector_hysteresis() -> None:
    det = Threshold("mismatch/kl", {"op": ">", "threshold": 1.0, "resolve_at": 0.5})
    state = det.initial_state()
    actives = [
        det.update(state, i, {"mismatch/kl": v}).active
        for i, v in enumerate([0.2, 1.5, 0.8, 0.6, 0.4, 0.9])
    ]
    assert actives == [False, True, True, True, False, False]
    with pytest.raises(ValueError, match="op"):
        Threshold("x", {"op": "=="})
    with pytest.raises(ValueError, match="unknown parameter"):
        Threshold("x", {"treshold": 1})


def test_climb_detector_stays_quiet_on_noise_and_fires_on_a_climb() -> None:
    rng = random.Random(0)
    det = Climb("mismatch/kl", {"warmup": 50})
    state = det.initial_state()
    # 1000 steps of stationary log-normal noise: no alarm.
    noise = [math.exp(math.log(1e-3) + rng.gauss(0, 0.3)) for _ in range(1000)]
    assert not any(det.update(state, i, {"mismatch/kl": v}).active for i, v in enumerate(noise))
    # A steady climb of the log-KL is caught within a few dozen steps, in baseline units.
    fired = None
    for i in range(300):
        value = 1e-3 * math.exp(0.05 * i + rng.gauss(0, 0.3))
        if det.update(state, 1000 + i, {"mismatch/kl": value}).active:
            fired = i
            break
    assert fired is not None and fired < 80, fired


def test_climb_detector_is_scale_free() -> None:
    """The same relative climb fires at the same step whatever the metric's units."""
    firsts = []
    for scale in (1e-6, 1.0, 1e6):
        det = Climb("m", {"warmup": 20})
        state = det.initial_state()
        rng = random.Random(1)
        series = [scale * math.exp(rng.gauss(0, 0.2)) for _ in range(40)] + [
            scale * math.exp(0.1 * i) for i in range(100)
        ]
        firsts.append(
            next(i for i, v in enumerate(series) if det.update(state, i, {"m": v}).active)
        )
    assert len(set(firsts)) == 1


def test_default_rules_build_and_unknown_detector_is_refused() -> None:
    for spec in DEFAULT_RULES:
        build_detector(spec.detector, spec.metric, spec.params)
    with pytest.raises(ValueError, match="unknown detector"):
        build_detector("magic", "x")


def test_standard_webhooks_reference_vector() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    signature = signing.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert signing.verify(
        secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", body, f"v1,bogus {signature}"
    )
    assert not signing.verify(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265331", body, signature)
    assert signing.new_secret().startswith("whsec_")


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.1",
        "172.16.5.4",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:1::",
        "224.0.0.1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not address_allowed(ipaddress.ip_address(address))


def test_public_addresses_are_allowed() -> None:
    assert address_allowed(ipaddress.ip_address("93.184.216.34"))
    assert address_allowed(ipaddress.ip_address("2606:4700::1111"))


def test_connect_time_check_resolves_names() -> None:
    with pytest.raises(ForbiddenTarget, match="non-public"):
        asyncio.run(checked_address("http://localhost:9/x", allow_private=False))
    with pytest.raises(ForbiddenTarget, match="non-public"):
        asyncio.run(checked_address("http://[::ffff:7f00:1]/x", allow_private=False))
    assert (
        str(asyncio.run(checked_address("http://127.0.0.1:9/x", allow_private=True))) == "127.0.0.1"
    )
    with pytest.raises(ValueError, match="http"):
        asyncio.run(checked_address("file:///etc/passwd", allow_private=True))


def test_retry_policy_backoff_jitter_and_retry_after() -> None:
    policy = RetryPolicy(base_s=1.0, max_s=60.0)
    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (10, 60.0)]:
        delays = [policy.delay(attempt, None) for _ in range(200)]
        assert cap / 2 <= min(delays) and max(delays) <= cap
    assert policy.delay(1, 30.0) == 30.0
    assert parse_retry_after("7", 0.0) == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470.0) == 10.0
    assert parse_retry_after("soon", 0.0) is None


EVENT = {
    "type": "alert.firing",
    "timestamp": "2026-01-01T00:00:00+00:00",
    "alert": {
        "id": 3,
        "run_id": "r-1",
        "run_name": "is-lag8-severe-s0",
        "project": "default",
        "group": "is",
        "rule": "collapse risk",
        "metric": "grad/norm",
        "severity": "critical",
        "state": "firing",
        "step": 140,
        "value": 31.5,
        "started_step": 138,
        "resolved_step": None,
        "fired_step": 140,
        "message": "x" * 5000,
        "fingerprint": "abc",
        "started_at": "2026-01-01T00:00:00+00:00",
        "resolved_at": None,
        "url": "http://keel:8750/compare?runs=r-1",
    },
}


def test_formats_name_the_essentials_and_respect_limits() -> None:
    import json

    for name in formats.FORMATS:
        body = formats.render(name, EVENT).decode()
        for needle in (
            "r-1",
            "is-lag8-severe-s0",
            "collapse risk",
            "grad/norm",
            "critical",
            "firing",
            "140",
            "31.5",
            "compare?runs=r-1",
        ):
            assert needle in body, (name, needle)
    slack = json.loads(formats.render("slack", EVENT))
    assert all(len(block["text"]["text"]) <= 3000 for block in slack["blocks"] if "text" in block)
    discord = json.loads(formats.render("discord", EVENT))
    assert len(discord["content"]) <= 2000 and len(discord["embeds"][0]["description"]) <= 4096
    am = json.loads(formats.render("alertmanager", EVENT))
    assert (
        am["version"] == "4"
        and am["status"] == "firing"
        and am["alerts"][0]["labels"]["alertname"] == "collapse risk"
    )
    assert am["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"


def test_collapse_risk_fires_on_gradient_spikes_relative_to_recent_history() -> None:
    from server.alerts.collapse import CollapseRisk

    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    rng = random.Random(0)
    # A slowly shrinking, noisy gradient norm: no alarm, whatever its absolute level.
    calm = [0.9 * math.exp(-i / 150) * math.exp(rng.gauss(0, 0.15)) for i in range(300)]
    assert not any(det.update(state, i, {"grad/norm": g}).active for i, g in enumerate(calm))
    spike = det.update(
        state,
        300,
        {"grad/norm": 4 * calm[-1], "mismatch/ratio_max": 265.0, "mismatch/ess_frac": 0.03},
    )
    assert spike.active and "ratio_max 265" in spike.message and "ess_frac 0.03" in spike.message
    # The spike did not move the baseline: the next normal step is calm again.
    assert not det.update(state, 301, {"grad/norm": calm[-1]}).active
    assert det.update(state, 302, {"grad/norm": math.inf}).active


def test_collapse_risk_lowers_the_bar_for_spikes_that_answer_a_ratio_jump() -> None:
    import copy

    from server.alerts.collapse import CollapseRisk

    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    rng = random.Random(1)
    for i in range(200):  # calm gradient (level 1), ratio tail around 3
        ratio = 3 * math.exp(rng.gauss(0, 0.2))
        row = {"grad/norm": math.exp(rng.gauss(0, 0.05)), "mismatch/ratio_max": ratio}
        assert not det.update(state, i, row).active
    assert math.exp(state["ratio_level"]) == pytest.approx(3, rel=0.2)

    def at_200(grad: float, ratio: float) -> bool:
        row = {"grad/norm": grad, "mismatch/ratio_max": ratio}
        return det.update(copy.deepcopy(state), 200, row).active

    # 2x: under the plain bar (2.5x); over the coupled bar (1.5x) only with a >= 10x ratio jump.
    assert not at_200(2.0, 3.0)
    assert not at_200(2.0, 20.0)  # ratio ~7x its level: not a jump
    assert at_200(2.0, 60.0)
    # A ratio jump the gradient does not answer (a loss that bounds its coefficient): quiet.
    assert not at_200(1.05, 500.0)
    # Any spike well above the plain bar fires, ratio or not.
    assert at_200(3.5, 3.0)
    row = {"grad/norm": 2.0, "mismatch/ratio_max": 60.0, "mismatch/ess_frac": 0.2}
    signal = det.update(state, 200, row)
    assert signal.active and "ratio tail" in signal.message and "ratio_max 60" in signal.message
    # Neither the spike nor the jump moved the levels: the same jump fires again.
    assert det.update(state, 201, {"grad/norm": 2.0, "mismatch/ratio_max": 60.0}).active


def test_collapse_risk_does_not_fire_before_the_reward_has_moved() -> None:
    from server.alerts.collapse import CollapseRisk

    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    calm = {"grad/norm": 1.0, "mismatch/ratio_max": 3.0, "reward/mean": 0.1, "reward/std": 0.1}
    rows = [calm] * 50
    spike = {"grad/norm": 5.0, "mismatch/ratio_max": 300.0, "reward/mean": 0.1, "reward/std": 0.1}
    assert not any(det.update(state, i, row).active for i, row in enumerate(rows))
    flat = det.update(state, 50, spike)
    assert not flat.active and "diverging" in flat.message
    for i in range(51, 60):  # the reward rises by 5 initial spreads
        det.update(state, i, {**rows[0], "reward/mean": 0.6})
    assert det.update(state, 60, {**spike, "reward/mean": 0.6}).active


def test_collapse_label() -> None:
    from keel.eval_alerts import collapse_step

    assert collapse_step([0.1, 0.3, 0.6, 0.55, 0.41, 0.39, 0.1]) == 5
    assert collapse_step([0.1, 0.45, 0.2]) is None  # never reached 0.5
    assert collapse_step([0.5, 0.6, 0.7, 0.65, 0.7]) is None
