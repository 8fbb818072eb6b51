"""HiCache: the hierarchical KV cache (docs/hicache.md). L1 is the KV pool the model reads, L2 a
host page pool (`host_pool.HostKVPool`), L3 a storage backend (`page_store.PageStore`: a directory,
`file_storage.FileStorage`, or a Mooncake store, `mooncake_storage.MooncakeStorage`);
`hiradix_cache.HiRadixCache` is the radix tree that knows where each node's KV lives."""
