"""The engine: the facade the front ends drive (`facade.Engine`), the milestone watcher and
queue (`watcher`), the project's set-up (`project`), the agent factory (`agents`) and how a
headless run ended (`outcome`).

Nothing is imported here: `anima init` and `anima status` need only `project`, not the rest.
"""
