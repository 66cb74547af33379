"""The nightly lemon report: gather the historian's numbers, plot them, render one page."""
