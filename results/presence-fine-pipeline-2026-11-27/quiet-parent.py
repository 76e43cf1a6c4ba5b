#!/usr/bin/env python3
# sleeper-parent.py without its periodic wake-ups: the helper blocks for good and the parent
# blocks in wait(), both at nice -10.
import os, subprocess, sys
os.setpriority(os.PRIO_PROCESS, 0, -10)
helper = subprocess.Popen([sys.executable, '-c', 'import os,select\nos.setpriority(os.PRIO_PROCESS,0,-10)\nselect.select([],[],[])'])
child = subprocess.Popen(sys.argv[1:])
rc = child.wait()
helper.kill(); helper.wait()
sys.exit(rc)
