"""TAP output shared by the Python reference checks (tests/check_*_torch.py):
ok() prints one numbered result, plan() prints the plan and returns the exit
status (1 when any check failed)."""
import sys

_n = 0
_failed = 0


def ok(cond, msg, detail=None):
    global _n, _failed
    _n += 1
    if not cond:
        _failed += 1
    print("%sok %d - %s" % ("" if cond else "not ", _n, msg))
    if not cond and detail:
        print("#   " + detail)
    sys.stdout.flush()
    return cond


def plan():
    print("1..%d" % _n)
    if _failed:
        print("# %d of %d checks failed" % (_failed, _n))
    return 1 if _failed else 0
