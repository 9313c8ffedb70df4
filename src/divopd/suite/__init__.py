"""``divopd bench paper`` / ``make paper``: the paper benchmark suite from a declarative plan (``plan``), trained
resumably (``runs``) and reported per group (``report``, ``coverage``); the demos (``demo``, ``demo_replay``) and the
models of the CPU settings (``models``)."""
