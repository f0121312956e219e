"""The admin console: server-rendered shell, a little JavaScript, SVG plots (nothing from a CDN)."""
