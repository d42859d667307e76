"""``bosch-eval analyze``: the paper's analyses of masks (§4.2, §4.3, Table 5, C.3)."""
