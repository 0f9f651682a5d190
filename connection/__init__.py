"""One live AITP connection's work, behind the thin consumer (``aitp.consumer``).

``connection.runner`` owns what a connection runs: its turn (``aitp.turn``
says where it is), the tasks and timers, the microphone's utterances, and
the session it opened (``connection.opening``, where the agent, its store and
the backends are put together).
"""
