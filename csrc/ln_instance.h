/*
 * ln_instance.h - one (storage, compute) instance of the kernel template:
 * the level's primitives, then the record helpers built on them. The
 * instance's parameters (LN_T, LN_FN, LN_LOAD, LN_STORE, LN_DB_ON_GRID) are undefined
 * afterwards; LN_S and LN_P are kept for the storage type's next instance.
 * See ln_tmpl.h. No include guard.
 */
#include LN_PRIMS
#include "ln_record.h"

#undef LN_T
#undef LN_FN
#undef LN_LOAD
#undef LN_STORE
#undef LN_DB_ON_GRID
