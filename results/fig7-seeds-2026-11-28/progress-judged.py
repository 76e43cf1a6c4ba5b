#!/usr/bin/env python3
"""fig7 with the dedup VM's Gleaner told its true progress (`app_progress = true`), seeds 1-8,
scored as scenarios/fig7-lab-score.py scores it: python3 THIS target/release/examples/sim"""
import json, subprocess, sys, tempfile, os
SIM = sys.argv[1]
base = open('scenarios/fig7-dedup-matmul.toml').read().replace('weighted_speedup = true', 'weighted_speedup = false')
def run(text):
    with tempfile.NamedTemporaryFile('w', suffix='.toml', delete=False) as f:
        f.write(text)
    try:
        r = json.loads(subprocess.run([SIM, f.name, '--json'], capture_output=True, text=True, check=True).stdout)
    finally:
        os.unlink(f.name)
    return [v['completed_work_ns'] / r['simulated_ns'] for v in r['vms']]
for seed in range(1, 9):
    b = base.replace('\nseed = 1\n', f'\nseed = {seed}\n', 1)
    m = b.index('[[vm]]\nname = "matmul"')
    solo = [run(b[:m])[0], run(b[:b.index('[[vm]]')] + b[m:])[0]]
    g = b.replace('guest = "none"', 'guest = "gleaner"\napp_progress = true', 1)
    sp = [x / y for x, y in zip(run(g), solo)]
    print(f'seed {seed}: progress-judged gleaner: dedup {sp[0]:.3f} system {sum(sp):.3f}', flush=True)
