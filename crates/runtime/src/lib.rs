//! The node runtime (DESIGN.md section 5). Under construction.
