"""``bosch-eval compare``: leaderboard runs of masks, rankings and heuristics through lm-eval."""
