"""The agent: one turn of the model with the page's and the server's tools,
approvals, text and voice. It stands on the protocol app (``aitp``: the
session's tools, the call ledger, the ports to the apps above) and talks
back to its connection through ``send`` alone (``parts.TurnIO``).

  loop.py          the turn's model loop
  request.py       what the model is asked each round, and the asking (quota, stream)
  page_tools.py    the page's tools: TOOL_CALL out, TOOL_RESULT in
  server_tools.py  the server's tools, run after approval when their risk needs one
  approvals.py     a person decides on a risky call
  voice.py         hearing the user, speaking the answer
  text.py          text frames out; the conversation window sent to the model
  parts.py         what the pieces share: the settings, the page, the way back
  store.py         where the turn writes, on the database threads
"""
