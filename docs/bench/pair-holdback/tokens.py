import re, sys, collections
d = sys.argv[1]
line_re = re.compile(r'^(\d+)\.(\d+) \[\d+ ([^\]]+)\] (.*)$')
arr = collections.defaultdict(dict)  # token -> node -> t
for k in range(5):
    for line in open(f"{d}/monitor-{k}.txt", errors="replace"):
        m = line_re.match(line.strip())
        if not m or m.group(3) == "lua": continue
        args = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(4))
        if len(args) > 6 and args[0] == "EVALSHA" and args[2] == "3" and "probe:hot" in args[5]:
            t = int(m.group(1)) * 1_000_000 + int(m.group(2))
            arr[args[6]][k] = t
gaps = collections.defaultdict(list)
spread = []
for tok, by in arr.items():
    if 0 in by and len(by) == 5:
        for k in range(1, 5):
            gaps[k].append(by[k] - by[0])
        spread.append(max(by[k] for k in range(1,5)) - min(by[k] for k in range(1,5)))
def show(name, v):
    v = sorted(v); q = lambda p: v[min(len(v)-1, int(p*len(v)))]
    print(f"{name:30} n={len(v):5} p10={q(.1):6} p50={q(.5):6} p90={q(.9):6} mean={sum(v)/len(v):8.1f}")
for k in range(1, 5): show(f"node {k} after first node", gaps[k])
show("spread among nodes 1-4", spread)
