import json,sys
def load(p):
    d=json.load(open(p))
    out={}
    for s in d['scenarios']:
        cf={c['config']:c for c in s['configs']}
        out[s['scenario']['name']]=(s['scenario']['set'],s['regret'],s['bench_vs_none'],s['system_vs_none'],
            {k:cf[k]['system_speedup'] for k in ('gleaner','gleaner+progress','gleaner@poll') if k in cf})
    return d,out
da,a=load(sys.argv[1]); db,b=load(sys.argv[2])
for k in a:
    if a[k]!=b[k]:
        sa,ra,ba,xa,ga=a[k]; sb,rb,bb,xb,gb=b[k]
        print(f"{sa:8} {k:45} regret {ra*100:6.1f} -> {rb*100:6.1f}  bench/none {ba*100:+6.1f} -> {bb*100:+6.1f}  sys/none {xa*100:+5.1f} -> {xb*100:+5.1f}  g@poll {ga.get('gleaner@poll',0):.3f}->{gb.get('gleaner@poll',0):.3f} g+p {ga.get('gleaner+progress',0):.3f}->{gb.get('gleaner+progress',0):.3f}")
for sa,sb in zip(da['summaries'],db['summaries']):
    print({k:v for k,v in sa.items() if not isinstance(v,(list,dict))})
    print({k:v for k,v in sb.items() if not isinstance(v,(list,dict))})
