"""TAP output shared by the Python reference checks (tests/check_*_torch.py):
ok() prints one numbered result, plan() prints the plan and returns the exit
status (1 when any check failed); strict_load() is the exports' common first
checks."""
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


def strict_load(net, sd, meta, arch):
    """An export's metadata names arch and its state dict sd loads into net
    with strict=True (two results); False when the load failed."""
    ok(meta.get("ps.arch") == arch, "metadata ps.arch %s (want %s)" % (meta.get("ps.arch"), arch))
    try:
        res = net.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        ok(False, "load_state_dict(strict=True): %s" % str(e).splitlines()[0])
        return False
    return ok(not res.missing_keys and not res.unexpected_keys,
              "load_state_dict(strict=True) into torchvision %s (%d tensors)" % (arch, len(sd)))
