"""The ``deeppod`` command made lazily: the same commands as typer makes of the app, each made
only when it runs."""

import typer.main

from deeppod.cli.main import app, command


def _shape(cmd) -> tuple:
    """What a user sees of a command: its help, its options and arguments, and its subcommands."""
    subs = getattr(cmd, "commands", {})
    return (cmd.help, cmd.short_help, cmd.hidden,
            [(p.name, tuple(p.opts), p.required, p.default if not callable(p.default) else "callable")
             for p in cmd.params],
            {name: _shape(sub) for name, sub in subs.items()})


def test_the_lazy_command_is_what_typer_makes_of_the_app():
    eager, lazy = typer.main.get_command(app), command()
    assert list(lazy.commands) == list(eager.commands)  # same names, same order (help lists them so)
    assert [p.name for p in lazy.params] == [p.name for p in eager.params]  # --version, -o, completion
    for name in eager.commands:
        assert _shape(lazy.commands[name]) == _shape(eager.commands[name]), name


def test_a_command_line_makes_only_the_command_it_runs(capsys):
    root = command()
    try:
        root.main(["jobs", "--help"], prog_name="deeppod", standalone_mode=False)
    finally:
        capsys.readouterr()
    assert set(root.commands._made) == {"jobs"}


def test_a_misspelt_command_is_answered_without_making_any(capsys):
    root = command()
    try:
        root.main(["jbos"], prog_name="deeppod", standalone_mode=True)
    except SystemExit as exc:
        assert exc.code == 2
    assert "Did you mean 'jobs'?" in capsys.readouterr().err
    assert not root.commands._made
