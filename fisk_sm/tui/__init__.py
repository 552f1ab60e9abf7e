"""`fisk-sm tui`: the full-screen UI (Textual), imported only by that command.

It needs the `fisk-sm[tui]` extra. Every mode is driven by what the line UI and the supervisor
already use: the typed events (`sink.TuiEvents`), the streamed-text callback, the step API
(`Run.step`, `Run.run_to`, `Run.explain`) and the control API (`fisk_sm.client`). The loop gets
no hooks of its own for it.

Every string from the model, a tool, a journal or the API reaches the screen as a `Content`
value built by `fisk_sm.tui.text`, never as markup: `[bold]` in an answer is shown as typed.
"""
