"""The browser demo the server serves at `/`: static files (index.html, JavaScript, CSS), shipped as this package's
data so that an installed server finds them with importlib.resources. No build step, no Python code."""
