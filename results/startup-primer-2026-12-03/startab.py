"""Start-up and teardown latency of `gleaner run --observe`: A/B of two builds, interleaved.
start: from launching the wrapper to the workload's first instruction (its `date`);
end: from the workload's last instruction to the wrapper's exit. bare: the same `sh -c` alone."""
import subprocess, time, statistics, sys, json
builds=dict(a.split('=',1) for a in sys.argv[2:])
N=int(sys.argv[1])
res={k:{'start':[],'end':[]} for k in list(builds)+['bare']}
for i in range(N):
    order=list(builds)+['bare']
    if i%2: order.reverse()
    for k in order:
        cmd=(['sh','-c','date +%s%N; date +%s%N'] if k=='bare' else [builds[k],'run','--observe','--','sh','-c','date +%s%N; date +%s%N'])
        t0=time.time_ns(); out=subprocess.run(cmd,capture_output=True,text=True).stdout.split(); t3=time.time_ns()
        res[k]['start'].append((int(out[0])-t0)/1e6); res[k]['end'].append((t3-int(out[1]))/1e6)
for k,v in res.items():
    s,e=v['start'],v['end']
    print(f"{k:5s} start median {statistics.median(s):5.1f} ms [{min(s):.1f}-{max(s):.1f}]  end median {statistics.median(e):4.1f} ms [{min(e):.1f}-{max(e):.1f}]  n={len(s)}")
if len(sys.argv)>2 and '--json' in sys.argv[-1:]: pass
json.dump(res,open('/tmp/startab.json','w'))
