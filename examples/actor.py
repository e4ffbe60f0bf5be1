"""An actor that acts with the learner's newest weights while the learner trains on its
experience: a contextual bandit with 3 arms.

    livefit serve --config examples/actor.toml
    python examples/actor.py --broker mqtt://127.0.0.1:1883 --model actor \\
        --key ./livefit-data/keys/weights-signing.pub

Each step the actor sees a state (4 numbers), asks the newest model for the reward of each
arm (one ``predict`` of 3 rows: state and the arm's one-hot), takes the best arm (a random
one with probability ``--explore``), gets a noisy reward from the environment and publishes
that experience as a sample. The learner trains on it and publishes new weights; the actor
swaps them in between steps. It needs three facts: the broker, the model name and the
learner's public key; the network comes with the weights. Prints one JSON line at the end:
steps, versions used, and the mean reward of the first and last quarter of the steps.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from livefit.clients.publisher import SamplePublisher
from livefit.clients.weights import WeightSubscriber

ARMS = 3
STATE = 4


class Bandit:
    """The environment: arm ``a``'s expected reward is ``tanh(w_a . state)``."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.w = self.rng.normal(size=(ARMS, STATE)) * 1.5

    def state(self) -> np.ndarray:
        return self.rng.normal(size=STATE).astype(np.float32)

    def reward(self, state: np.ndarray, arm: int) -> float:
        return float(np.tanh(self.w[arm] @ state) + self.rng.normal() * 0.1)


def rows(state: np.ndarray) -> np.ndarray:
    """One input row per arm: the state, then the arm's one-hot."""
    return np.hstack([np.tile(state, (ARMS, 1)), np.eye(ARMS, dtype=np.float32)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="mqtt://127.0.0.1:1883")
    parser.add_argument("--model", default="actor")
    parser.add_argument("--key", required=True, help="the learner's public key or its file")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--explore", type=float, default=0.2)
    parser.add_argument("--step-ms", type=float, default=5.0, help="pause between steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env, rng = Bandit(args.seed), np.random.default_rng(args.seed + 1)
    rewards, versions = [], []
    topic = f"livefit/{args.model}/samples"
    with WeightSubscriber(args.broker, args.model, verify_key=args.key) as weights, \
            SamplePublisher(args.broker, topic, fmt="msgpack") as publisher:  # fmt: skip
        weights.wait_for_version(0, timeout=60)  # the learner's first weights
        for _ in range(args.steps):
            state = env.state()
            values, version = weights.predict_with_version(rows(state))
            arm = int(rng.integers(ARMS)) if rng.random() < args.explore else int(values.argmax())
            reward = env.reward(state, arm)
            publisher.publish(rows(state)[arm], np.float32([reward]), batched=False)  # experience
            rewards.append(reward)
            versions.append(version)
            time.sleep(args.step_ms / 1000)
    quarter = max(1, args.steps // 4)
    print(json.dumps({
        "steps": args.steps, "versions": sorted(set(versions)),
        "first_quarter_reward": float(np.mean(rewards[:quarter])),
        "last_quarter_reward": float(np.mean(rewards[-quarter:])),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
