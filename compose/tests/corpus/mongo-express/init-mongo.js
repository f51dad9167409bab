db = db.getSiblingDB("app"); db.createCollection("items");
