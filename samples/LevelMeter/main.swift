print("level")
