#!/usr/bin/env python3
"""Runs of Gleaner's BPF programs per second, and their own run time, during a two-vCPU
ping-pong under `gleaner run --observe`, from `bpftool prog show` with
kernel.bpf_stats_enabled=1 (restored on every exit path). Two snapshots, 1.0 s and 2.5 s into
a 3 s run, so start-up and the programs' load are outside the difference.

  python3 prog_stats.py ROUNDS OUT.json NAME=PREFIX... (PREFIX: the command before `run`)
"""
import json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, '../..'))
WORKLOAD = [os.path.join(ROOT, 'target/release/gleaner'), 'workload', 'pingpong', '--duration', '3']
PROGRAMS = ('on_cpu_idle', 'on_switch', 'on_waking', 'on_hrtimer_star', 'on_wakeup_new',
            'on_fork', 'on_exit', 'refresh_idle_st', 'snapshot_tick_i', 'find_tick_funct')


def snapshot():
    out = subprocess.run(['bpftool', 'prog', 'show', '-j'], capture_output=True, text=True, check=True).stdout
    return {p['name']: (p.get('run_cnt', 0), p.get('run_time_ns', 0))
            for p in json.loads(out) if p.get('name') in PROGRAMS}


def one(prefix):
    proc = subprocess.Popen(prefix.split() + ['run', '--observe', '--'] + WORKLOAD,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    t0 = time.monotonic()
    time.sleep(1.0)
    a, ta = snapshot(), time.monotonic()
    time.sleep(1.5)
    b, tb = snapshot(), time.monotonic()
    out = proc.communicate()[0]
    rate = {n: ((b[n][0] - a.get(n, (0, 0))[0]) / (tb - ta), (b[n][1] - a.get(n, (0, 0))[1]) / (tb - ta))
            for n in b}
    tput = float(out.split('throughput=')[1].split()[0])
    return {'per_s': rate, 'throughput': tput}


def main():
    rounds, path = int(sys.argv[1]), sys.argv[2]
    configs = [a.split('=', 1) for a in sys.argv[3:]]
    with open('/proc/sys/kernel/bpf_stats_enabled') as f:
        before = f.read().strip()
    res = {n: [] for n, _ in configs}
    try:
        with open('/proc/sys/kernel/bpf_stats_enabled', 'w') as f:
            f.write('1')
        for r in range(rounds):
            for n, prefix in (configs if r % 2 == 0 else configs[::-1]):
                res[n].append(one(prefix))
    finally:
        with open('/proc/sys/kernel/bpf_stats_enabled', 'w') as f:
            f.write(before)
    json.dump({'load_after': open('/proc/loadavg').read(), 'res': res}, open(path, 'w'), indent=1)
    for n, runs in res.items():
        names = sorted({k for r in runs for k in r['per_s']})
        med = lambda xs: sorted(xs)[len(xs) // 2]
        cols = ', '.join(f"{k} {med([r['per_s'].get(k, (0, 0))[0] for r in runs]) / 1e3:.1f} k/s "
                         f"{med([r['per_s'].get(k, (0, 0))[1] for r in runs]) / 1e6:.2f} ms/s" for k in names)
        total = med([sum(v[1] for v in r['per_s'].values()) for r in runs]) / 1e6
        print(f"{n}: BPF run time {total:.2f} ms/s; {cols}; throughput {med([r['throughput'] for r in runs]):.0f}")


if __name__ == '__main__':
    main()
