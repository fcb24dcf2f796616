"""Timeline of hot-key hand-offs from hot_probe's events.txt and monitor-K.txt."""
import re, sys, statistics as st
d = sys.argv[1] if len(sys.argv) > 1 else "."
ev = []
for line in open(f"{d}/events.txt"):
    if line.startswith("#"):
        continue
    t, cid, what = line.split()
    ev.append((int(t), int(cid), what))
ev.sort()
line_re = re.compile(r'^(\d+)\.(\d+) \[\d+ ([^\]]+)\] (.*)$')
nodes = {}
for k in range(5):
    evs = []  # (t_us, kind, who)
    cur = None
    for line in open(f"{d}/monitor-{k}.txt", errors="replace"):
        m = line_re.match(line.strip())
        if not m:
            continue
        t = int(m.group(1)) * 1_000_000 + int(m.group(2))
        who, cmd = m.group(3), m.group(4)
        args = re.findall(r'"((?:[^"\\]|\\.)*)"', cmd)
        if not args:
            continue
        name = args[0].upper()
        if who != "lua":
            cur = None
            if name in ("EVALSHA", "EVAL") and any("probe:hot" in a for a in args):
                cur = [t, "script", who, []]
                evs.append(cur)
            continue
        if cur is not None:
            cur[3].append(args)
    out = []
    for t, _, who, inner in evs:
        names = [a[0].upper() for a in inner]
        if "DEL" in names or "PUBLISH" in names:
            kind = "rel"
        elif any(a[0].upper() == "SET" and a[1].endswith("stamp") for a in inner):
            kind = "grant"
        elif "SET" in names:
            kind = "refused"
        else:
            kind = "other:" + ",".join(names)
        out.append((t, kind, who))
    nodes[k] = out
# The first node: where most acquire attempts go.
counts = {k: sum(1 for e in v if e[1] in ("grant", "refused")) for k, v in nodes.items()}
F = max(counts, key=counts.get)
print("attempts per node:", counts, "first node:", F)
kinds = {}
for k, v in nodes.items():
    for e in v:
        kinds[(k, e[1])] = kinds.get((k, e[1]), 0) + 1
print("kinds:", sorted(kinds.items()))
import bisect
def after(k, kind, t):
    lst = [e for e in nodes[k] if e[1] == kind]
    ts = [e[0] for e in lst]
    i = bisect.bisect_left(ts, t)
    return lst[i] if i < len(lst) else None
rels = [e for e in ev if e[2] == "release"]
wons = [e for e in ev if e[2] == "won"]
won_ts = [e[0] for e in wons]
seg = {"release→node F": [], "node F release→grant on F": [], "grant F→last grant": [],
       "last grant→won": [], "total release→won": [], "won→release (hold)": [], "refused per hand-off": []}
for (tr, cid, _) in rels:
    i = bisect.bisect_right(won_ts, tr)
    if i >= len(wons):
        break
    tw, wid, _ = wons[i]
    rF = after(F, "rel", tr)
    if rF is None or rF[0] > tw:
        continue
    gF = after(F, "grant", rF[0])
    if gF is None or gF[0] > tw:
        continue
    others = [after(k, "grant", gF[0] - 200) for k in nodes if k != F]
    others = [o for o in others if o is not None and o[0] <= tw]
    last = max([gF[0]] + [o[0] for o in others])
    seg["release→node F"].append(rF[0] - tr)
    seg["node F release→grant on F"].append(gF[0] - rF[0])
    seg["grant F→last grant"].append(last - gF[0])
    seg["last grant→won"].append(tw - last)
    seg["total release→won"].append(tw - tr)
    ref = [e for e in nodes[F] if e[1] == "refused" and rF[0] < e[0] < tw]
    seg["refused per hand-off"].append(len(ref))
for (tw, wid, _) in wons:
    nxt = [e for e in rels if e[0] >= tw and e[1] == wid]
    if nxt:
        seg["won→release (hold)"].append(nxt[0][0] - tw)
for name, v in seg.items():
    if not v:
        print(name, "none"); continue
    v = sorted(v)
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
    print(f"{name:28} n={len(v):5} mean={st.mean(v):8.1f} p10={q(.1):6} p50={q(.5):6} p90={q(.9):6}")
print("hand-offs/s:", len(wons) / ((wons[-1][0] - wons[0][0]) / 1e6))
