"""calib-check: is a calibration set fit for the search? Its panel, scores and report."""
