//! The global membership service (DESIGN.md section 6). Under construction.
