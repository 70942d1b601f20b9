#!/usr/bin/env python3
"""Regenerates the oracle vectors of tests/data/oracle/<case>/ with the
numpy oracle of docs/spec/oracle.py (an implementation of SEMANTICS.md
independent of libhd).  Needs numpy; run from anywhere:

    python3 tests/data/oracle/gen.py

Each case folder holds case.txt and out.bf16 ([steps, 2304] bf16 LE), and
the final state of the last MLA layer (c_kv.bf16, k_rope.bf16) and of the
first KDA layer (S.f32), when the pattern has one.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', '..', 'docs', 'spec'))
import oracle  # noqa: E402
import synth  # noqa: E402

CASES = [
    # name, seed, experts, pattern, context, steps
    ('MKKM', 5, 8, 'MKKM', 97, 3),
    ('KM', 7, 9, 'KM', 0, 4),
]


def run(name, seed, experts, pattern, context, steps):
    W = oracle.Weights(synth.model(seed, experts, pattern))
    c_kv, k_rope = synth.prefilled_cache(seed, context)
    state = oracle.new_state(pattern, c_kv, k_rope)
    outs = []
    for t in range(steps):
        h, _ = oracle.step(W, pattern, experts, synth.step_input(seed, t), state)
        outs.append(h)
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'case.txt'), 'w') as f:
        f.write(f'seed={seed}\nexperts={experts}\npattern={pattern}\n'
                f'context={context}\nsteps={steps}\nproducer=docs/spec/oracle.py\n')
    np.asarray(outs, dtype='<u2').tofile(os.path.join(d, 'out.bf16'))
    last_m = max(i for i, k in enumerate(pattern) if k == 'M')
    synth.f32_to_bf16_bits(state[last_m]['c_kv']).astype('<u2').tofile(os.path.join(d, 'c_kv.bf16'))
    synth.f32_to_bf16_bits(state[last_m]['k_rope']).astype('<u2').tofile(os.path.join(d, 'k_rope.bf16'))
    if 'K' in pattern:
        first_k = pattern.index('K')
        state[first_k]['S'].astype('<f4').tofile(os.path.join(d, 'S.f32'))


if __name__ == '__main__':
    np.seterr(over='ignore')
    for case in CASES:
        run(*case)
        print('wrote', case[0])
