"""The VM's storage pool: a buffer given back from a finalizer the garbage collector runs while the pool is
allocating (on the same thread) is accounted later instead of waiting for the lock that thread holds."""

from __future__ import annotations

import gc
import threading

from rpcsrv.executor.vm.registers import StoragePool


def test_a_release_inside_an_allocation_does_not_wait_for_it():
    pool = StoragePool()
    held = [pool.alloc(1000)]
    block = held[0].block
    done = threading.Event()

    def give_back_while_allocating():
        with pool._lock:  # as when gc runs Storage.__del__ inside alloc's critical section
            held.clear()  # the last reference: its finalizer gives the block back here
        done.set()

    t = threading.Thread(target=give_back_while_allocating, daemon=True)
    t.start()
    t.join(5)
    assert done.is_set(), "the finalizer waited for the lock its own thread held"
    assert pool.live_bytes == block.nbytes  # not accounted yet: the lock's holder did not look
    again = pool.alloc(1000)  # the next allocation accounts it and reuses the block
    assert again.block is block and pool.live_bytes == block.nbytes and pool.pooled_bytes == 0


def test_released_storage_is_pooled_and_reused():
    pool = StoragePool()
    first = pool.alloc(5000)
    block = first.block
    del first
    gc.collect()
    assert pool.live_bytes == 0 and pool.pooled_bytes == block.nbytes
    assert pool.alloc(5000).block is block
