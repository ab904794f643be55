"""How the Developer prompt grows over a 30-round milestone: the budget keeps it bounded
while every earlier commit stays named. Reference: round-20 prompt ≤ 1.5 × round-2."""

from __future__ import annotations

from instant import run_milestone

ROUNDS = 30


def main() -> None:
    run, clock, _ = run_milestone(ROUNDS)
    run.run()
    sizes = [len(p) for p in clock.prompts[:ROUNDS]]
    for i, size in enumerate(sizes, 1):
        print(f"round {i:2d}: {size:6d} characters")
    commits = [it.commit[:7] for it in run.record.iterations if it.commit]
    last = clock.prompts[ROUNDS - 1]
    named = sum(1 for c in commits[: ROUNDS - 1] if c in last)
    ratio = sizes[-1] / sizes[1]
    print(f"last/second = {sizes[-1]}/{sizes[1]} = {ratio:.2f} "
          f"(reference: ≤ 1.5 at round 20: {sizes[19] / sizes[1]:.2f}); "
          f"earlier commits named in the last prompt: {named}/{min(len(commits), ROUNDS - 1)}")
    print(f"BENCH prompt_growth_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
