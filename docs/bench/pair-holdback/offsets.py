import sys, bisect
exec(open("analyze.py").read().split("# The first node")[0])
F = 0
rel = [e[0] for e in nodes[F] if e[1] == "rel"]
att = [(e[0], e[1]) for e in nodes[F] if e[1] in ("grant", "refused")]
first_off, all_off, grant_off = [], [], []
by_rel = {}
for t, k in att:
    i = bisect.bisect_right(rel, t) - 1
    if i < 0: continue
    off = t - rel[i]
    by_rel.setdefault(i, []).append((off, k))
for i, lst in by_rel.items():
    lst.sort()
    first_off.append(lst[0][0])
    for off, k in lst:
        all_off.append(off)
        if k == "grant": grant_off.append(off)
def show(name, v):
    v = sorted(v); q = lambda p: v[min(len(v)-1, int(p*len(v)))]
    print(f"{name:30} n={len(v):5} p10={q(.1):6} p25={q(.25):6} p50={q(.5):6} p75={q(.75):6} p90={q(.9):6}")
show("first attempt after release", first_off)
show("grant after release", grant_off)
show("every attempt after release", all_off)
# histogram of all offsets in 100us bins
import collections
h = collections.Counter(min(o // 100, 30) for o in all_off)
print(" ".join(f"{b*100}:{h[b]}" for b in range(31)))
