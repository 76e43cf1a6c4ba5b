#!/usr/bin/env python3
"""Scores scenarios/fig7-dedup-matmul.toml as the policy lab scores a scenario (issue 16's
fig7 target): each VM's compute completed per second over its solo run as configured (16
vCPUs, guest none); system = the sum. Rows: none, gleaner, and static vCPU counts for the dedup
VM, without and with retention.

    cargo build --release -p gleaner-sim --example sim
    python3 scenarios/fig7-lab-score.py target/release/examples/sim
"""
# Scores scenarios/fig7-dedup-matmul.toml as the policy lab does: each VM's compute completed
# per second over its solo run as configured (16 vCPUs, guest none); system = sum.
import json, subprocess, sys, re
B = sys.argv[1]
base = open('scenarios/fig7-dedup-matmul.toml').read().replace('weighted_speedup = true', 'weighted_speedup = false')
def run(text, name):
    p = f'/tmp/fig7-lab-score-{name}.toml'
    open(p, 'w').write(text)
    r = json.loads(subprocess.run([B, p, '--json'], capture_output=True, text=True, check=True).stdout)
    return [v['completed_work_ns'] / r['simulated_ns'] for v in r['vms']]
dedup_only = base[:base.index('[[vm]]\nname = "matmul"')]
matmul_only = base[:base.index('[[vm]]')] + base[base.index('[[vm]]\nname = "matmul"'):]
solo = [run(dedup_only, 'solo0')[0], run(matmul_only, 'solo1')[0]]
rows = []
for label, edit in [('none', ''), ('gleaner', 'gleaner')] + [(f'static-{k}', k) for k in (8, 4, 2)] + [(f'static-{k}+retain', k) for k in (8, 4)]:
    t = base
    if edit == 'gleaner':
        t = t.replace('guest = "none"', 'guest = "gleaner"', 1)
    elif edit:
        t = t.replace('vcpus = 16\nguest = "none"', f'vcpus = 16\nactive_vcpus = {edit}\nguest = "{"hold" if "retain" in label else "none"}"', 1)
    rates = run(t, label.replace('+', '_'))
    sp = [r / s for r, s in zip(rates, solo)]
    rows.append((label, sp[0], sum(sp)))
    print(f'{label:18} dedup {sp[0]:.3f}  system {sum(sp):.3f}', flush=True)
