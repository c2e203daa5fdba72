"""The plugin host: hook specifications, loading plugins (built-in and third-party alike), the
table of component kinds, and the public types plugins work with. Imports no torch."""
