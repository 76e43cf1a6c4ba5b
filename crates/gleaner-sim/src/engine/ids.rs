//! Typed indices for the engine's tables, so that a vCPU index cannot be used as a thread's,
//! and the tables they index.
//!
//! vCPU ids are global over the host (VM `k`'s vCPUs are `base..base + n`); the host scheduler
//! uses the same numbering as plain `u32`.

use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// An index into one of the engine's tables.
pub trait Id: Copy {
    fn from_index(i: usize) -> Self;
    fn index(self) -> usize;
}

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u32);

        impl $name {
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl Id for $name {
            fn from_index(i: usize) -> Self {
                $name(i as u32)
            }
            fn index(self) -> usize {
                self.0 as usize
            }
        }
    };
}

id!(
    /// A VM, in scenario order.
    VmId
);
id!(
    /// A vCPU, numbered over the whole host.
    VcpuId
);
id!(
    /// A workload thread, numbered over the whole host.
    ThreadId
);
id!(
    /// A thread program (one per thread group).
    ProgramId
);
id!(
    /// A blocking mutex, numbered over the whole host.
    MutexId
);
id!(
    /// A guest-kernel spinlock, numbered over the whole host.
    SpinId
);
id!(
    /// A bounded queue, numbered over the whole host.
    QueueId
);
id!(
    /// A barrier, numbered over the whole host.
    BarrierId
);

impl VcpuId {
    /// The vCPU `i` places after this one (a VM's vCPU `i` is `base.offset(i)`).
    pub fn offset(self, i: u32) -> VcpuId {
        VcpuId(self.0 + i)
    }

    /// This vCPU's index inside its VM, whose first vCPU is `base`.
    pub fn local(self, base: VcpuId) -> usize {
        (self.0 - base.0) as usize
    }
}

/// A vector indexed by one kind of id.
pub struct Table<I, T> {
    items: Vec<T>,
    id: PhantomData<I>,
}

impl<I: Id, T> Default for Table<I, T> {
    fn default() -> Self {
        Table {
            items: Vec::new(),
            id: PhantomData,
        }
    }
}

impl<I: Id, T> Table<I, T> {
    /// Append an item and return its id.
    pub fn push(&mut self, item: T) -> I {
        let id = I::from_index(self.items.len());
        self.items.push(item);
        id
    }

    /// The id the next pushed item will get.
    pub fn next_id(&self) -> I {
        I::from_index(self.items.len())
    }

    /// Grow to `len` items made by `make` (never shrinks).
    pub fn grow_to(&mut self, len: usize, make: impl FnMut() -> T) {
        if len > self.items.len() {
            self.items.resize_with(len, make);
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = I> {
        (0..self.items.len()).map(I::from_index)
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }
}

impl<I: Id, T> Index<I> for Table<I, T> {
    type Output = T;
    fn index(&self, id: I) -> &T {
        &self.items[id.index()]
    }
}

impl<I: Id, T> IndexMut<I> for Table<I, T> {
    fn index_mut(&mut self, id: I) -> &mut T {
        &mut self.items[id.index()]
    }
}
