import sys
ev=[l.split() for l in open(sys.argv[1]+"/events.txt") if not l.startswith("#")]
won=sorted(int(t) for t,c,w in ev if w=="won")
calls={}
waits=[]
last={}
for t,c,w in sorted(ev,key=lambda e:int(e[0])):
    if w=="call": last[c]=int(t)
    if w=="won": waits.append(int(t)-last[c])
wins={}
for t,c,w in ev:
    if w=="won": wins[c]=wins.get(c,0)+1
waits.sort()
print(f"hand-offs/s {len(won)/((won[-1]-won[0])/1e6):.0f}  wait p50 {waits[len(waits)//2]} us p99 {waits[int(len(waits)*.99)]} us  wins {sorted(wins.values())}")
