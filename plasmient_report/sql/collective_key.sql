-- Module: collective_key
-- The key of a collective instance, defined once: the same operation seen on several ranks has the same key — its
-- process group, else its group's ranks, else empty — the same collective and the same sequence number. The align
-- stage makes the ends of one instance coincide across ranks with it (before the measure stage runs); the
-- collectives module builds its instances on it.

CREATE OR REPLACE MACRO collective_key(process_group, group_ranks) AS coalesce(process_group, group_ranks, '');
COMMENT ON MACRO collective_key IS 'collective_key(process_group, group_ranks): the instance key of a collectives row — process group, else group ranks, else empty; with collective and seq it names one operation across ranks';
